//! Security: token (JWT) authentication and role-based authorization, for
//! the Pulsar protocol ([`crate::connection`]) and the admin API
//! ([`crate::admin`]), and the key and token tooling of `cms-broker tokens`.
//!
//! Authentication: a token is a JWT signed with HS256/384/512 (secret key
//! file, raw bytes, at least [`SECRET_KEY_BYTES_MIN`]) or RS256/384/512 /
//! ES256/384 (public key file, PEM); its `sub` is the role. `exp` and `nbf`
//! are checked with a bounded clock skew, `aud` when an audience is
//! configured, `alg` must belong to the configured key (so `alg: none` and
//! HS256 signed with a public key are refused). Signature checks are
//! constant-time (the crypto backend's HMAC / signature verification); the
//! superuser role list is compared with `subtle` so a role's position in it
//! does not show in timing. Tokens are never logged: errors name the reason
//! only.
//!
//! Authorization ([`Authorizer`]): superusers may do everything; the roles
//! in a tenant's `adminRoles` administer the tenant (every namespace and
//! topic call, produce and consume); other roles need a `produce` /
//! `consume` grant on the namespace or on the topic (Pulsar's
//! `auth_policies`), and a subscription listed in `subscription_auth_roles`
//! may only be consumed by the roles listed there. Every decision is a pure
//! function of the role, the tenant, the namespace policies and the request.
//!
//! Promise: with authentication enabled and no key configured, nothing is
//! built (the broker refuses to start: fail closed).

use std::collections::BTreeSet;
use std::path::Path;
use std::time::{SystemTime, UNIX_EPOCH};

use jsonwebtoken::{Algorithm, DecodingKey, EncodingKey, Header, Validation};
use serde::{Deserialize, Serialize};
use subtle::ConstantTimeEq;

use crate::tenancy::{NamespacePolicies, TenantInfo};

/// Shortest accepted HMAC secret key, in bytes (256 bits).
pub const SECRET_KEY_BYTES_MIN: usize = 32;
/// Largest clock skew tolerated on `exp` / `nbf`, in seconds.
pub const CLOCK_SKEW_S_MAX: u64 = 600;
/// Longest token accepted, in bytes (a bound on work per CONNECT / request).
pub const TOKEN_BYTES_MAX: usize = 16 * 1024;
/// The only binary-protocol authentication method served.
pub const TOKEN_METHOD: &str = "token";

/// Why a token or a key was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AuthError {
    /// No credentials were presented.
    #[error("authentication required: no token presented")]
    Missing,
    /// The credentials were refused (the reason never contains the token).
    #[error("authentication failed: {0}")]
    Invalid(String),
    /// A key file cannot be used.
    #[error("{0}")]
    Key(String),
}

/// Authentication settings, from the broker configuration.
#[derive(Debug, Clone, Default)]
pub struct AuthSettings {
    /// Authentication on without a key given (fails closed).
    pub enabled: bool,
    /// HMAC secret key file.
    pub secret_key: Option<std::path::PathBuf>,
    /// Public key file (PEM, RSA or EC).
    pub public_key: Option<std::path::PathBuf>,
    /// Required audience (`aud`), when set.
    pub audience: Option<String>,
    /// Clock skew tolerated on `exp` / `nbf`, in seconds.
    pub clock_skew_s: u64,
    /// Superuser roles.
    pub superuser_roles: Vec<String>,
}

/// Token claims we read and write.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Claims {
    /// The role.
    pub sub: String,
    /// Expiry (seconds since the epoch).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exp: Option<u64>,
    /// Not valid before (seconds since the epoch).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nbf: Option<u64>,
    /// Audience.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub aud: Option<String>,
}

/// Who a request comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Identity {
    /// The role (`sub`).
    pub role: String,
    /// Expiry of the credentials (seconds since the epoch), if any.
    pub exp: Option<u64>,
}

/// Seconds since the epoch.
pub fn now_s() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

fn read_key(path: &Path, what: &str) -> Result<Vec<u8>, AuthError> {
    std::fs::read(path)
        .map_err(|e| AuthError::Key(format!("reading {what} {}: {e}", path.display())))
}

/// Validates tokens against the configured key.
pub struct Authenticator {
    key: DecodingKey,
    validation: Validation,
    superusers: Vec<String>,
}

impl std::fmt::Debug for Authenticator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Authenticator")
            .field("algorithms", &self.validation.algorithms)
            .finish_non_exhaustive()
    }
}

impl Authenticator {
    /// The authenticator of `s`: `Ok(None)` when authentication is off
    /// (no key, not enabled); an error when it is on and no usable key is
    /// configured (fail closed).
    pub fn from_settings(s: &AuthSettings) -> Result<Option<Self>, AuthError> {
        if s.clock_skew_s > CLOCK_SKEW_S_MAX {
            return Err(AuthError::Key(format!(
                "auth_clock_skew_s must be at most {CLOCK_SKEW_S_MAX}"
            )));
        }
        let (key, algorithms) = match (&s.secret_key, &s.public_key) {
            (None, None) if !s.enabled => return Ok(None),
            (None, None) => {
                return Err(AuthError::Key(
                    "authentication is enabled but neither auth_secret_key nor auth_public_key is configured"
                        .into(),
                ));
            }
            (Some(_), Some(_)) => {
                return Err(AuthError::Key(
                    "configure one of auth_secret_key and auth_public_key, not both".into(),
                ));
            }
            (Some(p), None) => {
                let secret = read_key(p, "the secret key")?;
                if secret.len() < SECRET_KEY_BYTES_MIN {
                    return Err(AuthError::Key(format!(
                        "secret key {} has {} bytes; at least {SECRET_KEY_BYTES_MIN} are needed",
                        p.display(),
                        secret.len()
                    )));
                }
                (
                    DecodingKey::from_secret(&secret),
                    vec![Algorithm::HS256, Algorithm::HS384, Algorithm::HS512],
                )
            }
            (None, Some(p)) => {
                let pem = read_key(p, "the public key")?;
                if let Ok(k) = DecodingKey::from_rsa_pem(&pem) {
                    (
                        k,
                        vec![
                            Algorithm::RS256,
                            Algorithm::RS384,
                            Algorithm::RS512,
                            Algorithm::PS256,
                            Algorithm::PS384,
                            Algorithm::PS512,
                        ],
                    )
                } else if let Ok(k) = DecodingKey::from_ec_pem(&pem) {
                    (k, vec![Algorithm::ES256, Algorithm::ES384])
                } else {
                    return Err(AuthError::Key(format!(
                        "public key {} is not a PEM RSA or EC public key",
                        p.display()
                    )));
                }
            }
        };
        let mut validation = Validation::new(algorithms[0]);
        validation.algorithms = algorithms;
        validation.set_required_spec_claims(&["sub"]);
        validation.validate_exp = true;
        validation.validate_nbf = true;
        validation.leeway = s.clock_skew_s;
        match &s.audience {
            Some(a) => validation.set_audience(&[a]),
            None => validation.validate_aud = false,
        }
        Ok(Some(Authenticator {
            key,
            validation,
            superusers: s.superuser_roles.clone(),
        }))
    }

    /// The identity of `token`, or why it is refused.
    pub fn authenticate(&self, token: &str) -> Result<Identity, AuthError> {
        let token = token.trim();
        if token.is_empty() {
            return Err(AuthError::Missing);
        }
        if token.len() > TOKEN_BYTES_MAX {
            return Err(AuthError::Invalid(format!(
                "token longer than {TOKEN_BYTES_MAX} bytes"
            )));
        }
        let data = jsonwebtoken::decode::<Claims>(token, &self.key, &self.validation)
            .map_err(|e| AuthError::Invalid(describe(&e)))?;
        if data.claims.sub.is_empty() {
            return Err(AuthError::Invalid("token has an empty subject".into()));
        }
        Ok(Identity {
            role: data.claims.sub,
            exp: data.claims.exp,
        })
    }

    /// Whether `exp` (of a connection's credentials) has passed, counting
    /// the configured skew.
    pub fn expired(&self, exp: Option<u64>, now: u64) -> bool {
        exp.is_some_and(|e| e.saturating_add(self.validation.leeway) < now)
    }

    /// Whether `role` is a superuser (compared in constant time per entry,
    /// every entry compared).
    pub fn is_superuser(&self, role: &str) -> bool {
        is_in(&self.superusers, role)
    }
}

/// Whether `role` is in `list`, comparing every entry in constant time.
pub fn is_in(list: &[String], role: &str) -> bool {
    let mut found = subtle::Choice::from(0u8);
    for r in list {
        found |= r.as_bytes().ct_eq(role.as_bytes());
    }
    bool::from(found)
}

/// A reason without the token.
fn describe(e: &jsonwebtoken::errors::Error) -> String {
    use jsonwebtoken::errors::ErrorKind as K;
    match e.kind() {
        K::ExpiredSignature => "token expired".into(),
        K::ImmatureSignature => "token not valid yet (nbf)".into(),
        K::InvalidAudience => "token audience does not match".into(),
        K::InvalidSignature => "token signature does not verify".into(),
        K::InvalidAlgorithm | K::InvalidAlgorithmName => {
            "token algorithm is not the configured key's".into()
        }
        K::MissingRequiredClaim(c) => format!("token has no {c} claim"),
        K::InvalidToken | K::Base64(_) | K::Json(_) | K::Utf8(_) => "malformed token".into(),
        _ => "token refused".into(),
    }
}

// ---------------------------------------------------------------- tooling

/// A new random HMAC secret key (32 bytes).
pub fn new_secret_key() -> Vec<u8> {
    use rand::RngCore;
    let mut k = vec![0u8; SECRET_KEY_BYTES_MIN];
    rand::rng().fill_bytes(&mut k);
    k
}

/// Key pair algorithm of `tokens create-key-pair`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum KeyPairAlgorithm {
    /// RSA 2048, RS256 tokens.
    Rs256,
    /// ECDSA P-256, ES256 tokens.
    Es256,
}

/// A new key pair as (private key PEM PKCS#8, public key PEM SPKI).
pub fn new_key_pair(alg: KeyPairAlgorithm) -> Result<(String, String), AuthError> {
    let a = match alg {
        KeyPairAlgorithm::Rs256 => &rcgen::PKCS_RSA_SHA256,
        KeyPairAlgorithm::Es256 => &rcgen::PKCS_ECDSA_P256_SHA256,
    };
    let kp = rcgen::KeyPair::generate_for(a)
        .map_err(|e| AuthError::Key(format!("generating the key pair: {e}")))?;
    Ok((kp.serialize_pem(), kp.public_key_pem()))
}

/// Signing key of `tokens create`.
pub enum SigningKey {
    /// HMAC secret (raw bytes).
    Secret(Vec<u8>),
    /// Private key PEM (RSA or EC).
    Private(Vec<u8>),
}

/// A signed token for `claims`.
pub fn create_token(key: &SigningKey, claims: &Claims) -> Result<String, AuthError> {
    let (k, alg) = match key {
        SigningKey::Secret(s) => {
            if s.len() < SECRET_KEY_BYTES_MIN {
                return Err(AuthError::Key(format!(
                    "secret key has {} bytes; at least {SECRET_KEY_BYTES_MIN} are needed",
                    s.len()
                )));
            }
            (EncodingKey::from_secret(s), Algorithm::HS256)
        }
        SigningKey::Private(pem) => {
            if let Ok(k) = EncodingKey::from_rsa_pem(pem) {
                (k, Algorithm::RS256)
            } else if let Ok(k) = EncodingKey::from_ec_pem(pem) {
                (k, Algorithm::ES256)
            } else {
                return Err(AuthError::Key(
                    "private key is not a PEM RSA or EC private key".into(),
                ));
            }
        }
    };
    jsonwebtoken::encode(&Header::new(alg), claims, &k)
        .map_err(|e| AuthError::Key(format!("signing the token: {e}")))
}

/// Parses a duration like `30s`, `15m`, `1h`, `7d`, `1y` (seconds).
pub fn parse_duration_s(s: &str) -> Result<u64, String> {
    let s = s.trim();
    let (num, unit) = s.split_at(s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len()));
    let n: u64 = num
        .parse()
        .map_err(|_| format!("bad duration {s:?}: expected a number and a unit (s, m, h, d, y)"))?;
    let mult = match unit {
        "" | "s" => 1,
        "m" => 60,
        "h" => 3600,
        "d" => 86_400,
        "w" => 7 * 86_400,
        "y" => 365 * 86_400,
        other => {
            return Err(format!(
                "bad duration unit {other:?}: use s, m, h, d, w or y"
            ));
        }
    };
    n.checked_mul(mult)
        .ok_or_else(|| format!("duration {s:?} is too long"))
}

// ---------------------------------------------------------------- authorization

/// Actions a role may be granted (Pulsar's `AuthAction`).
pub const AUTH_ACTIONS: [&str; 6] = [
    "produce",
    "consume",
    "functions",
    "sources",
    "sinks",
    "packages",
];

pub use cms_admin_types::policies::AuthPolicies;

/// Checks a list of actions; the error names the bad one.
pub fn validate_actions(actions: &[String]) -> Result<BTreeSet<String>, String> {
    let mut out = BTreeSet::new();
    for a in actions {
        if !AUTH_ACTIONS.contains(&a.as_str()) {
            return Err(format!(
                "unknown action {a:?}; expected one of {AUTH_ACTIONS:?}"
            ));
        }
        out.insert(a.clone());
    }
    Ok(out)
}

/// What a request wants to do to a topic.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TopicOp {
    /// Publish (PRODUCER, schema creation).
    Produce,
    /// Consume from a subscription (SUBSCRIBE, subscription admin calls).
    Consume {
        /// The subscription, when the request names one.
        subscription: Option<String>,
    },
    /// Look the topic up, read its metadata (produce or consume grant).
    Lookup,
}

/// The decisions, pure.
#[derive(Debug, Clone, Copy)]
pub struct Authorizer;

impl Authorizer {
    /// Whether `role` administers `tenant` (superusers are checked by the caller).
    pub fn is_tenant_admin(role: &str, tenant: &TenantInfo) -> bool {
        is_in(&tenant.admin_roles, role)
    }

    /// Whether a non-superuser, non-admin `role` may do `op` on `topic`
    /// (full name `persistent://t/ns/x`; `base` is the partitioned parent's
    /// full name for a partition) under the namespace's policies.
    pub fn can_topic(
        role: &str,
        policies: &NamespacePolicies,
        topic: &str,
        base: Option<&str>,
        op: &TopicOp,
    ) -> bool {
        let ap = &policies.auth_policies;
        let granted = |action: &str| {
            let ns = ap
                .namespace_auth
                .get(role)
                .is_some_and(|a| a.contains(action));
            let on = |t: &str| {
                ap.destination_auth
                    .get(t)
                    .and_then(|m| m.get(role))
                    .is_some_and(|a| a.contains(action))
            };
            ns || on(topic) || base.is_some_and(on)
        };
        match op {
            TopicOp::Produce => granted("produce"),
            TopicOp::Lookup => granted("produce") || granted("consume"),
            TopicOp::Consume { subscription } => {
                granted("consume")
                    && subscription.as_ref().is_none_or(|s| {
                        ap.subscription_auth_roles
                            .get(s)
                            .is_none_or(|roles| roles.is_empty() || roles.contains(role))
                    })
            }
        }
    }

    /// Whether a non-superuser, non-admin `role` may list the namespace's
    /// topics: any grant on the namespace.
    pub fn can_list_namespace(role: &str, policies: &NamespacePolicies) -> bool {
        policies
            .auth_policies
            .namespace_auth
            .get(role)
            .is_some_and(|a| a.contains("produce") || a.contains("consume"))
    }
}

// ---------------------------------------------------------------- checks against the store

/// Reads a tenant's info; None when the tenant does not exist.
pub async fn tenant_info(
    state: &crate::service::BrokerState,
    tenant: &str,
) -> Result<Option<TenantInfo>, String> {
    let path = crate::tenancy::tenant_path(&state.layout, tenant);
    match state.store.get(&path).await {
        Ok((data, _)) if data.is_empty() => Ok(Some(TenantInfo::default())),
        Ok((data, _)) => serde_json::from_slice(&data)
            .map(Some)
            .map_err(|e| format!("tenant {tenant}: corrupt node: {e}")),
        Err(cms_bookie::metadata::MetadataError::NoNode(_)) => Ok(None),
        Err(e) => Err(format!("reading tenant {tenant}: {e}")),
    }
}

/// Whether `role` is a superuser or an admin of `tenant`; Err(reason) when
/// not (or when the store cannot tell: fail closed).
pub async fn check_tenant_admin(
    state: &crate::service::BrokerState,
    auth: &Authenticator,
    role: &str,
    tenant: &str,
) -> Result<(), String> {
    if auth.is_superuser(role) {
        return Ok(());
    }
    match tenant_info(state, tenant).await? {
        Some(t) if Authorizer::is_tenant_admin(role, &t) => Ok(()),
        _ => Err(format!("role {role} is not an admin of tenant {tenant}")),
    }
}

/// What a request wants to do to a namespace.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NamespaceOp {
    /// List its topics (any produce / consume grant on the namespace).
    ListTopics,
}

/// Whether `role` may do `op` on `tenant/namespace`.
pub async fn check_namespace(
    state: &crate::service::BrokerState,
    auth: &Authenticator,
    role: &str,
    tenant: &str,
    namespace: &str,
    op: NamespaceOp,
) -> Result<(), String> {
    if check_tenant_admin(state, auth, role, tenant).await.is_ok() {
        return Ok(());
    }
    let policies =
        crate::tenancy::namespace_policies(&*state.store, &state.layout, tenant, namespace)
            .await
            .map_err(|e| e.to_string())?;
    let allowed = match (op, &policies) {
        (NamespaceOp::ListTopics, Some(p)) => Authorizer::can_list_namespace(role, p),
        (_, None) => false,
    };
    if allowed {
        Ok(())
    } else {
        Err(format!(
            "role {role} may not list the topics of {tenant}/{namespace}"
        ))
    }
}

/// Whether `role` may do `op` on `topic`.
pub async fn check_topic(
    state: &crate::service::BrokerState,
    auth: &Authenticator,
    role: &str,
    topic: &crate::topic_name::TopicName,
    op: &TopicOp,
) -> Result<(), String> {
    if check_tenant_admin(state, auth, role, &topic.tenant)
        .await
        .is_ok()
    {
        return Ok(());
    }
    let policies = crate::tenancy::namespace_policies(
        &*state.store,
        &state.layout,
        &topic.tenant,
        &topic.namespace,
    )
    .await
    .map_err(|e| e.to_string())?;
    let full = topic.to_string();
    let base = partitioned_base(&full);
    let allowed = policies
        .as_ref()
        .is_some_and(|p| Authorizer::can_topic(role, p, &full, base, op));
    if allowed {
        Ok(())
    } else {
        let what = match op {
            TopicOp::Produce => "produce to".to_string(),
            TopicOp::Lookup => "look up".to_string(),
            TopicOp::Consume {
                subscription: Some(s),
            } => format!("consume subscription {s} of"),
            TopicOp::Consume { subscription: None } => "consume from".to_string(),
        };
        Err(format!("role {role} may not {what} {full}"))
    }
}

/// `persistent://t/ns/x` for `persistent://t/ns/x-partition-3`.
pub fn partitioned_base(full: &str) -> Option<&str> {
    let (base, n) = full.rsplit_once("-partition-")?;
    (!n.is_empty() && n.bytes().all(|b| b.is_ascii_digit())).then_some(base)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key_file(dir: &tempfile::TempDir, name: &str, bytes: &[u8]) -> std::path::PathBuf {
        let p = dir.path().join(name);
        std::fs::write(&p, bytes).unwrap();
        p
    }

    fn claims(sub: &str, exp: Option<u64>, nbf: Option<u64>, aud: Option<&str>) -> Claims {
        Claims {
            sub: sub.into(),
            exp,
            nbf,
            aud: aud.map(str::to_string),
        }
    }

    #[test]
    fn enabled_without_key_fails_closed() {
        let s = AuthSettings {
            enabled: true,
            ..Default::default()
        };
        assert!(Authenticator::from_settings(&s).is_err());
        assert!(
            Authenticator::from_settings(&AuthSettings::default())
                .unwrap()
                .is_none()
        );
    }

    #[test]
    fn short_secret_refused() {
        let d = tempfile::tempdir().unwrap();
        let s = AuthSettings {
            secret_key: Some(key_file(&d, "k", b"short")),
            ..Default::default()
        };
        assert!(Authenticator::from_settings(&s).is_err());
    }

    #[test]
    fn hs256_matrix() {
        let d = tempfile::tempdir().unwrap();
        let secret = new_secret_key();
        let s = AuthSettings {
            secret_key: Some(key_file(&d, "k", &secret)),
            audience: Some("cms".into()),
            clock_skew_s: 5,
            ..Default::default()
        };
        let a = Authenticator::from_settings(&s).unwrap().unwrap();
        let key = SigningKey::Secret(secret);
        let now = now_s();
        let ok = create_token(&key, &claims("alice", Some(now + 60), None, Some("cms"))).unwrap();
        assert_eq!(a.authenticate(&ok).unwrap().role, "alice");
        let expired =
            create_token(&key, &claims("alice", Some(now - 60), None, Some("cms"))).unwrap();
        assert_eq!(
            a.authenticate(&expired),
            Err(AuthError::Invalid("token expired".into()))
        );
        let within_skew =
            create_token(&key, &claims("alice", Some(now - 2), None, Some("cms"))).unwrap();
        assert!(a.authenticate(&within_skew).is_ok());
        let future =
            create_token(&key, &claims("alice", None, Some(now + 600), Some("cms"))).unwrap();
        assert!(a.authenticate(&future).is_err());
        let wrong_aud = create_token(&key, &claims("alice", None, None, Some("x"))).unwrap();
        assert!(a.authenticate(&wrong_aud).is_err());
        let other = SigningKey::Secret(new_secret_key());
        let wrong_sig = create_token(&other, &claims("alice", None, None, Some("cms"))).unwrap();
        assert!(a.authenticate(&wrong_sig).is_err());
        assert!(a.authenticate("not.a.token").is_err());
        assert_eq!(a.authenticate(""), Err(AuthError::Missing));
        // alg none: header {"alg":"none"}, no signature.
        let none = "eyJhbGciOiJub25lIiwidHlwIjoiSldUIn0.eyJzdWIiOiJhbGljZSIsImF1ZCI6ImNtcyJ9.";
        assert!(a.authenticate(none).is_err());
        // An RS256 token is refused by an HMAC-configured broker.
        let (private, _) = new_key_pair(KeyPairAlgorithm::Es256).unwrap();
        let es = create_token(
            &SigningKey::Private(private.into_bytes()),
            &claims("alice", None, None, Some("cms")),
        )
        .unwrap();
        assert!(a.authenticate(&es).is_err());
        // Never echo the token.
        let e = a.authenticate(&wrong_sig).unwrap_err().to_string();
        assert!(!e.contains(&wrong_sig));
    }

    #[test]
    fn es256_key_pair() {
        let d = tempfile::tempdir().unwrap();
        let (private, public) = new_key_pair(KeyPairAlgorithm::Es256).unwrap();
        let s = AuthSettings {
            public_key: Some(key_file(&d, "pub.pem", public.as_bytes())),
            ..Default::default()
        };
        let a = Authenticator::from_settings(&s).unwrap().unwrap();
        let t = create_token(
            &SigningKey::Private(private.into_bytes()),
            &claims("bob", None, None, None),
        )
        .unwrap();
        assert_eq!(a.authenticate(&t).unwrap().role, "bob");
    }

    #[test]
    fn durations() {
        assert_eq!(parse_duration_s("1h"), Ok(3600));
        assert_eq!(parse_duration_s("30"), Ok(30));
        assert_eq!(parse_duration_s("2d"), Ok(172_800));
        assert!(parse_duration_s("1x").is_err());
        assert!(parse_duration_s("h").is_err());
    }

    #[test]
    fn grants() {
        let mut p = NamespacePolicies::default();
        let t = "persistent://a/ns/t";
        p.auth_policies
            .namespace_auth
            .insert("prod".into(), ["produce".to_string()].into());
        p.auth_policies
            .destination_auth
            .entry(t.into())
            .or_default()
            .insert("cons".into(), ["consume".to_string()].into());
        p.auth_policies
            .subscription_auth_roles
            .insert("locked".into(), ["other".to_string()].into());
        let consume = |s: &str| TopicOp::Consume {
            subscription: Some(s.into()),
        };
        assert!(Authorizer::can_topic(
            "prod",
            &p,
            t,
            None,
            &TopicOp::Produce
        ));
        assert!(!Authorizer::can_topic("prod", &p, t, None, &consume("s")));
        assert!(Authorizer::can_topic("cons", &p, t, None, &consume("s")));
        assert!(!Authorizer::can_topic(
            "cons",
            &p,
            t,
            None,
            &consume("locked")
        ));
        assert!(!Authorizer::can_topic(
            "cons",
            &p,
            "persistent://a/ns/u",
            None,
            &TopicOp::Lookup
        ));
        assert!(Authorizer::can_topic(
            "cons",
            &p,
            "persistent://a/ns/t-partition-0",
            Some(t),
            &TopicOp::Lookup
        ));
        assert!(Authorizer::can_list_namespace("prod", &p));
        assert!(!Authorizer::can_list_namespace("cons", &p));
        assert!(!Authorizer::can_topic(
            "nobody",
            &p,
            t,
            None,
            &TopicOp::Lookup
        ));
    }
}
