//! What each command does: the REST calls (paths as in `docs/admin-api.md`)
//! and the table view of the answer. Destructive commands go through
//! [`Ctx::confirm`]; long ones show progress on a terminal only.

use std::io::{BufRead, IsTerminal, Write};
use std::time::{Duration, Instant};

use serde_json::{Map, Value, json};

use crate::cli::*;
use crate::client::{Admin, AdminError, AdminResult, seg};
use crate::output::{SCALARS, Shown, View};

/// What commands run with.
pub struct Ctx {
    /// The REST client.
    pub admin: Admin,
    /// `--yes`.
    pub yes: bool,
}

impl Ctx {
    /// Asks "`what`?" on a terminal unless `--yes`; without a terminal and
    /// without `--yes`, refuses (usage error).
    pub fn confirm(&self, what: &str) -> AdminResult<()> {
        if self.yes {
            return Ok(());
        }
        let stdin = std::io::stdin();
        if !stdin.is_terminal() {
            return Err(AdminError::Usage(format!(
                "refusing to {what} without confirmation: stdin is not a terminal; pass --yes"
            )));
        }
        eprint!("{what}? [y/N] ");
        let _ = std::io::stderr().flush();
        let mut line = String::new();
        stdin
            .lock()
            .read_line(&mut line)
            .map_err(|e| AdminError::Local(format!("reading the answer: {e}")))?;
        if matches!(line.trim(), "y" | "Y" | "yes" | "YES" | "Yes") {
            Ok(())
        } else {
            Err(AdminError::Usage(format!("not confirmed: did not {what}")))
        }
    }
}

/// A spinner on stderr while `f` runs, only when stderr is a terminal.
fn with_spinner<T>(msg: &str, f: impl FnOnce() -> T) -> T {
    let pb = if std::io::stderr().is_terminal() {
        let pb = indicatif::ProgressBar::new_spinner();
        pb.set_message(msg.to_string());
        pb.enable_steady_tick(Duration::from_millis(120));
        Some(pb)
    } else {
        None
    };
    let out = f();
    if let Some(pb) = pb {
        pb.finish_and_clear();
    }
    out
}

/// A counting progress bar on stderr, only when stderr is a terminal.
fn progress(len: u64, what: &str) -> Option<indicatif::ProgressBar> {
    if !std::io::stderr().is_terminal() {
        return None;
    }
    let pb = indicatif::ProgressBar::new(len);
    if let Ok(style) =
        indicatif::ProgressStyle::with_template(&format!("[{{bar:30}}] {{pos}}/{{len}} {what}"))
    {
        pb.set_style(style);
    }
    Some(pb)
}

/// Runs `f` (one long request) with a counting progress bar on a terminal:
/// `remaining()` is polled every 300 ms on another thread and the bar shows
/// `total - remaining` of `total`. Without a terminal, just `f`.
fn with_countdown<T>(
    what: &str,
    total: u64,
    remaining: impl Fn() -> Option<u64> + Sync,
    f: impl FnOnce() -> T,
) -> T {
    let Some(pb) = progress(total, what) else {
        return f();
    };
    pb.tick();
    let done = std::sync::atomic::AtomicBool::new(false);
    let out = std::thread::scope(|scope| {
        scope.spawn(|| {
            while !done.load(std::sync::atomic::Ordering::Acquire) {
                if let Some(r) = remaining() {
                    pb.set_position(total.saturating_sub(r));
                }
                std::thread::sleep(Duration::from_millis(300));
            }
        });
        let out = f();
        done.store(true, std::sync::atomic::Ordering::Release);
        out
    });
    pb.finish_and_clear();
    out
}

/// The `(lower, upper)` ranges of a `GET .../bundles` answer.
fn bundle_ranges(v: &Value) -> AdminResult<Vec<(u64, u64)>> {
    let bad = || AdminError::Local(format!("unexpected bundles answer: {v}"));
    let bounds = v["boundaries"]
        .as_array()
        .ok_or_else(bad)?
        .iter()
        .map(|b| {
            b.as_str()
                .and_then(|s| s.strip_prefix("0x"))
                .and_then(|h| u64::from_str_radix(h, 16).ok())
                .ok_or_else(bad)
        })
        .collect::<AdminResult<Vec<u64>>>()?;
    Ok(bounds.windows(2).map(|w| (w[0], w[1])).collect())
}

/// `TENANT/NS` → (tenant, ns).
pub fn parse_ns(s: &str) -> AdminResult<(String, String)> {
    match s.split('/').collect::<Vec<_>>()[..] {
        [t, n] if !t.is_empty() && !n.is_empty() => Ok((t.to_string(), n.to_string())),
        _ => Err(AdminError::Usage(format!(
            "namespace must be TENANT/NS, got {s:?}"
        ))),
    }
}

/// `TENANT/NS/NAME` → (tenant, ns, name).
pub fn parse_three(s: &str, what: &str) -> AdminResult<(String, String, String)> {
    match s.split('/').collect::<Vec<_>>()[..] {
        [t, n, x] if !t.is_empty() && !n.is_empty() && !x.is_empty() => {
            Ok((t.to_string(), n.to_string(), x.to_string()))
        }
        _ => Err(AdminError::Usage(format!(
            "{what} must be TENANT/NS/{}, got {s:?}",
            what.to_uppercase()
        ))),
    }
}

/// A topic name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Topic {
    /// `persistent` or `non-persistent`.
    pub domain: String,
    /// Tenant.
    pub tenant: String,
    /// Namespace.
    pub ns: String,
    /// Local name.
    pub name: String,
}

impl Topic {
    /// `[persistent://|non-persistent://]TENANT/NS/TOPIC`.
    pub fn parse(s: &str) -> AdminResult<Topic> {
        let (domain, rest) = match s.split_once("://") {
            Some((d @ ("persistent" | "non-persistent"), r)) => (d, r),
            Some((d, _)) => {
                return Err(AdminError::Usage(format!(
                    "topic domain must be persistent:// or non-persistent://, got {d}://"
                )));
            }
            None => ("persistent", s),
        };
        let (tenant, ns, name) = parse_three(rest, "topic")?;
        Ok(Topic {
            domain: domain.to_string(),
            tenant,
            ns,
            name,
        })
    }

    /// `/admin/v2/{domain}/{t}/{ns}/{topic}`.
    pub fn path(&self) -> String {
        format!(
            "/admin/v2/{}/{}/{}/{}",
            self.domain,
            seg(&self.tenant),
            seg(&self.ns),
            seg(&self.name)
        )
    }

    /// The full name.
    pub fn full(&self) -> String {
        format!(
            "{}://{}/{}/{}",
            self.domain, self.tenant, self.ns, self.name
        )
    }
}

fn ns_path(t: &str, n: &str) -> String {
    format!("/admin/v2/namespaces/{}/{}", seg(t), seg(n))
}

fn done(msg: impl Into<String>) -> AdminResult<Shown> {
    Ok(Shown::Done(msg.into()))
}

fn shown(v: Value, view: View) -> AdminResult<Shown> {
    Ok(Shown::Value(v, view))
}

/// Runs one command (not `completions`, handled by `main`).
pub fn run(ctx: &Ctx, cmd: Command) -> AdminResult<Shown> {
    match cmd {
        Command::Clusters(c) => clusters(ctx, c),
        Command::Tenants(c) => tenants(ctx, c),
        Command::Namespaces(c) => namespaces(ctx, c),
        Command::Topics(c) => topics(ctx, c),
        Command::Queues(c) => queues(ctx, c),
        Command::Quotas(c) => quotas(ctx, c),
        Command::Brokers(c) => brokers(ctx, c),
        Command::Bookies(c) => bookies(ctx, c),
        Command::Permissions(c) => permissions(ctx, c),
        Command::Ledgers(c) => ledgers(ctx, c),
        Command::Completions { .. } => Err(AdminError::Local(
            "completions are printed by main".to_string(),
        )),
    }
}

fn clusters(ctx: &Ctx, c: Clusters) -> AdminResult<Shown> {
    let a = &ctx.admin;
    match c {
        Clusters::List => shown(a.get("/admin/v2/clusters")?, View::List("CLUSTER")),
        Clusters::Get { name } => shown(
            a.get(&format!("/admin/v2/clusters/{}", seg(&name)))?,
            View::Object,
        ),
    }
}

fn tenant_body(info: &TenantInfo) -> Value {
    json!({"adminRoles": info.admin_roles, "allowedClusters": info.allowed_clusters})
}

fn tenants(ctx: &Ctx, c: Tenants) -> AdminResult<Shown> {
    let a = &ctx.admin;
    let p = |n: &str| format!("/admin/v2/tenants/{}", seg(n));
    match c {
        Tenants::Create { name, info } => {
            a.put(&p(&name), Some(&tenant_body(&info)))?;
            done(format!("tenant {name} created"))
        }
        Tenants::List => shown(a.get("/admin/v2/tenants")?, View::List("TENANT")),
        Tenants::Get { name } => shown(a.get(&p(&name))?, View::Object),
        Tenants::Update { name, info } => {
            a.post(&p(&name), Some(&tenant_body(&info)))?;
            done(format!("tenant {name} updated"))
        }
        Tenants::Delete { name } => {
            ctx.confirm(&format!("delete tenant {name}"))?;
            a.delete(&p(&name))?;
            done(format!("tenant {name} deleted"))
        }
    }
}

fn set_policy(ctx: &Ctx, namespace: &str, policy: &str, body: Value) -> AdminResult<Shown> {
    let (t, n) = parse_ns(namespace)?;
    ctx.admin
        .post(&format!("{}/{policy}", ns_path(&t, &n)), Some(&body))?;
    done(format!("{policy} of {t}/{n} set"))
}

fn on_off(enable: bool, disable: bool) -> bool {
    enable && !disable
}

fn dispatch_body(d: &DispatchRateArgs) -> Value {
    json!({
        "dispatchThrottlingRateInMsg": d.msgs,
        "dispatchThrottlingRateInByte": d.bytes,
        "ratePeriodInSecond": d.period,
        "relativeToPublishRate": d.relative_to_publish_rate,
    })
}

fn namespaces(ctx: &Ctx, c: Namespaces) -> AdminResult<Shown> {
    let a = &ctx.admin;
    match c {
        Namespaces::Create { namespace, bundles } => {
            let (t, n) = parse_ns(&namespace)?;
            let body = bundles.map(|b| json!({"bundles": {"numBundles": b}}));
            a.put(&ns_path(&t, &n), body.as_ref())?;
            done(format!("namespace {t}/{n} created"))
        }
        Namespaces::List { tenant } => shown(
            a.get(&format!("/admin/v2/namespaces/{}", seg(&tenant)))?,
            View::List("NAMESPACE"),
        ),
        Namespaces::Delete { namespace, force } => {
            let (t, n) = parse_ns(&namespace)?;
            let what = if force {
                format!("delete namespace {t}/{n} with all its topics and queues")
            } else {
                format!("delete namespace {t}/{n}")
            };
            ctx.confirm(&what)?;
            let q = if force { "?force=true" } else { "" };
            let delete = || a.delete(&format!("{}{q}", ns_path(&t, &n)));
            // A forced delete removes the topics one by one: count them down.
            let topics_path = format!("{}/topics", ns_path(&t, &n));
            let left = || {
                a.get(&topics_path)
                    .ok()
                    .and_then(|v| v.as_array().map(|x| x.len() as u64))
            };
            match left().filter(|n| force && *n > 0) {
                Some(total) => with_countdown("topics deleted", total, left, delete)?,
                None => with_spinner(&format!("deleting {t}/{n}"), delete)?,
            };
            done(format!("namespace {t}/{n} deleted"))
        }
        Namespaces::Topics { namespace } => {
            let (t, n) = parse_ns(&namespace)?;
            shown(
                a.get(&format!("{}/topics", ns_path(&t, &n)))?,
                View::List("TOPIC"),
            )
        }
        Namespaces::Policies { namespace } => {
            let (t, n) = parse_ns(&namespace)?;
            shown(a.get(&ns_path(&t, &n))?, View::Object)
        }
        Namespaces::GetPolicy { namespace, policy } => {
            let (t, n) = parse_ns(&namespace)?;
            let path = if policy == Policy::BacklogQuota {
                format!("{}/backlogQuotaMap", ns_path(&t, &n))
            } else {
                format!("{}/{}", ns_path(&t, &n), policy.rest())
            };
            shown(a.get(&path)?, View::Object)
        }
        Namespaces::ClearPolicy { namespace, policy } => {
            let (t, n) = parse_ns(&namespace)?;
            a.delete(&format!("{}/{}", ns_path(&t, &n), policy.rest()))?;
            done(format!("{} of {t}/{n} reset to the default", policy.rest()))
        }
        Namespaces::Bundles { namespace } => {
            let (t, n) = parse_ns(&namespace)?;
            shown(
                a.get(&format!("{}/bundles", ns_path(&t, &n)))?,
                View::Object,
            )
        }
        Namespaces::SplitBundle {
            namespace,
            bundle,
            unload,
        } => {
            let (t, n) = parse_ns(&namespace)?;
            a.put(
                &format!("{}/{}/split?unload={unload}", ns_path(&t, &n), seg(&bundle)),
                None,
            )?;
            done(format!("bundle {bundle} of {t}/{n} split"))
        }
        Namespaces::SetBundles { namespace, count } => {
            let (t, n) = parse_ns(&namespace)?;
            let path = format!("{}/bundles", ns_path(&t, &n));
            let have = bundle_ranges(&a.get(&path)?)?;
            if have.len() > count as usize {
                return Err(AdminError::Local(format!(
                    "namespace {t}/{n} has {} bundles; bundles can only be split, never merged",
                    have.len()
                )));
            }
            let todo = count as usize - have.len();
            let pb = progress(todo as u64, "bundles split");
            for _ in 0..todo {
                let ranges = bundle_ranges(&a.get(&path)?)?;
                let widest = ranges
                    .iter()
                    .max_by_key(|(lo, hi)| hi - lo)
                    .ok_or_else(|| AdminError::Local("the namespace has no bundles".into()))?;
                let name = format!("0x{:08x}_0x{:08x}", widest.0, widest.1);
                a.put(&format!("{}/{}/split", ns_path(&t, &n), seg(&name)), None)?;
                if let Some(pb) = &pb {
                    pb.inc(1);
                }
            }
            if let Some(pb) = pb {
                pb.finish_and_clear();
            }
            done(format!("namespace {t}/{n} has {count} bundles"))
        }
        Namespaces::Unload { namespace, bundle } => {
            let (t, n) = parse_ns(&namespace)?;
            match bundle {
                Some(b) => {
                    a.put(&format!("{}/{}/unload", ns_path(&t, &n), seg(&b)), None)?;
                    done(format!("bundle {b} of {t}/{n} unloaded"))
                }
                None => {
                    a.put(&format!("{}/unload", ns_path(&t, &n)), None)?;
                    done(format!("namespace {t}/{n} unloaded"))
                }
            }
        }
        Namespaces::SetRetention {
            namespace,
            time_minutes,
            size_mb,
        } => set_policy(
            ctx,
            &namespace,
            "retention",
            json!({"retentionTimeInMinutes": time_minutes, "retentionSizeInMB": size_mb}),
        ),
        Namespaces::SetBacklogQuota {
            namespace,
            kind,
            limit_bytes,
            limit_seconds,
            policy,
        } => {
            let (t, n) = parse_ns(&namespace)?;
            let kind = match kind {
                BacklogQuotaType::DestinationStorage => "destination_storage",
                BacklogQuotaType::MessageAge => "message_age",
            };
            let policy = match policy {
                BacklogPolicy::ProducerRequestHold => "producer_request_hold",
                BacklogPolicy::ProducerException => "producer_exception",
                BacklogPolicy::ConsumerBacklogEviction => "consumer_backlog_eviction",
            };
            a.post(
                &format!("{}/backlogQuota?backlogQuotaType={kind}", ns_path(&t, &n)),
                Some(&json!({"limitSize": limit_bytes, "limitTime": limit_seconds, "policy": policy})),
            )?;
            done(format!("backlogQuota {kind} of {t}/{n} set"))
        }
        Namespaces::SetMessageTtl { namespace, seconds } => {
            set_policy(ctx, &namespace, "messageTTL", json!(seconds))
        }
        Namespaces::SetPublishRate {
            namespace,
            msgs,
            bytes,
        } => set_policy(
            ctx,
            &namespace,
            "publishRate",
            json!({"publishThrottlingRateInMsg": msgs, "publishThrottlingRateInByte": bytes}),
        ),
        Namespaces::SetDispatchRate(d) => {
            set_policy(ctx, &d.namespace, "dispatchRate", dispatch_body(&d))
        }
        Namespaces::SetSubscriptionDispatchRate(d) => set_policy(
            ctx,
            &d.namespace,
            "subscriptionDispatchRate",
            dispatch_body(&d),
        ),
        Namespaces::SetMaxProducersPerTopic(c) => {
            set_policy(ctx, &c.namespace, "maxProducersPerTopic", json!(c.value))
        }
        Namespaces::SetMaxConsumersPerTopic(c) => {
            set_policy(ctx, &c.namespace, "maxConsumersPerTopic", json!(c.value))
        }
        Namespaces::SetMaxConsumersPerSubscription(c) => set_policy(
            ctx,
            &c.namespace,
            "maxConsumersPerSubscription",
            json!(c.value),
        ),
        Namespaces::SetMaxTopicsPerNamespace(c) => {
            set_policy(ctx, &c.namespace, "maxTopicsPerNamespace", json!(c.value))
        }
        Namespaces::SetMaxSubscriptionsPerTopic(c) => set_policy(
            ctx,
            &c.namespace,
            "maxSubscriptionsPerTopic",
            json!(c.value),
        ),
        Namespaces::SetDeduplication {
            namespace,
            enable,
            disable,
        } => set_policy(
            ctx,
            &namespace,
            "deduplication",
            json!(on_off(enable, disable)),
        ),
        Namespaces::SetAutoTopicCreation {
            namespace,
            enable,
            disable,
            topic_type,
            num_partitions,
        } => {
            let mut body = Map::new();
            body.insert(
                "allowAutoTopicCreation".into(),
                json!(on_off(enable, disable)),
            );
            body.insert("topicType".into(), json!(topic_type));
            if let Some(p) = num_partitions {
                body.insert("defaultNumPartitions".into(), json!(p));
            }
            set_policy(ctx, &namespace, "autoTopicCreation", Value::Object(body))
        }
        Namespaces::SetPersistence {
            namespace,
            ensemble,
            write_quorum,
            ack_quorum,
            mark_delete_rate,
        } => {
            if !(ensemble >= write_quorum && write_quorum >= ack_quorum && ack_quorum >= 1) {
                return Err(AdminError::Usage(format!(
                    "need E >= Qw >= Qa >= 1, got E={ensemble} Qw={write_quorum} Qa={ack_quorum}"
                )));
            }
            set_policy(
                ctx,
                &namespace,
                "persistence",
                json!({
                    "bookkeeperEnsemble": ensemble,
                    "bookkeeperWriteQuorum": write_quorum,
                    "bookkeeperAckQuorum": ack_quorum,
                    "managedLedgerMaxMarkDeleteRate": mark_delete_rate,
                }),
            )
        }
        Namespaces::SetReplicationClusters {
            namespace,
            clusters,
        } => set_policy(ctx, &namespace, "replication", json!(clusters)),
        Namespaces::SetSchemaCompatibilityStrategy {
            namespace,
            strategy,
        } => set_policy(
            ctx,
            &namespace,
            "schemaCompatibilityStrategy",
            json!(strategy),
        ),
        Namespaces::SetIsAllowAutoUpdateSchema {
            namespace,
            enable,
            disable,
        } => set_policy(
            ctx,
            &namespace,
            "isAllowAutoUpdateSchema",
            json!(on_off(enable, disable)),
        ),
    }
}

fn position_body(p: Position) -> Value {
    match p {
        Position::Earliest => json!({"ledgerId": -1, "entryId": -1}),
        Position::Latest => json!({"ledgerId": i64::MAX, "entryId": i64::MAX}),
        Position::At(l, e) => json!({"ledgerId": l, "entryId": e}),
    }
}

/// The partition count of `t` (0 = not partitioned).
fn partitions_of(a: &Admin, t: &Topic) -> AdminResult<u64> {
    let v = a.get(&format!("{}/partitions", t.path()))?;
    Ok(v.get("partitions").and_then(Value::as_u64).unwrap_or(0))
}

const SUBSCRIPTION_COLUMNS: [(&str, &str); 5] = [
    ("TYPE", "type"),
    ("BACKLOG", "msgBacklog"),
    ("UNACKED", "unackedMessages"),
    ("DURABLE", "isDurable"),
    ("BLOCKED", "blockedSubscriptionOnUnackedMsgs"),
];

/// The table view of topic stats, with a per-partition table when
/// `per_partition`.
fn stats_view_with(per_partition: bool) -> View {
    let mut sections = vec![
        ("Topic", SCALARS, View::Object),
        (
            "Publishers",
            "publishers",
            View::Rows(vec![("PRODUCER", "producerName"), ("ACCESS", "accessMode")]),
        ),
        (
            "Subscriptions",
            "subscriptions",
            View::Map("SUBSCRIPTION", SUBSCRIPTION_COLUMNS.to_vec()),
        ),
    ];
    if per_partition {
        sections.push((
            "Partitions",
            "partitions",
            View::Map(
                "PARTITION",
                vec![
                    ("MSG-RATE-IN", "msgRateIn"),
                    ("MSG-RATE-OUT", "msgRateOut"),
                    ("MSGS-IN", "msgInCounter"),
                    ("MSGS-OUT", "msgOutCounter"),
                    ("STORAGE-BYTES", "storageSize"),
                ],
            ),
        ));
    }
    View::Sections(sections)
}

fn peek_one(a: &Admin, t: &Topic, sub: &str, n: u32) -> AdminResult<Option<Value>> {
    let path = format!("{}/subscription/{}/position/{n}", t.path(), seg(sub));
    let p = match a.get_raw(&path) {
        Ok(p) => p,
        Err(AdminError::Http { status: 404, .. }) if n > 1 => return Ok(None),
        Err(e) => return Err(e),
    };
    let mut m = Map::new();
    let mut props = Map::new();
    for (k, v) in &p.headers {
        let Some(rest) = k.strip_prefix("x-pulsar-") else {
            continue;
        };
        match rest {
            "message-id" => m.insert("messageId".into(), json!(v)),
            "publish-time" => m.insert("publishTime".into(), json!(v)),
            "producer-name" => m.insert("producerName".into(), json!(v)),
            "sequence-id" => m.insert("sequenceId".into(), json!(v)),
            "num-batch-message" => m.insert("numBatchMessages".into(), json!(v)),
            "partition-key" => m.insert("key".into(), json!(v)),
            other => {
                if let Some(prop) = other.strip_prefix("property-") {
                    props.insert(prop.to_string(), json!(v));
                }
                None
            }
        };
    }
    m.insert("properties".into(), Value::Object(props));
    match String::from_utf8(p.payload) {
        Ok(s) => m.insert("payload".into(), json!(s)),
        Err(e) => m.insert(
            "payloadHex".into(),
            json!(
                e.as_bytes()
                    .iter()
                    .map(|b| format!("{b:02x}"))
                    .collect::<String>()
            ),
        ),
    };
    Ok(Some(Value::Object(m)))
}

fn topics(ctx: &Ctx, c: Topics) -> AdminResult<Shown> {
    let a = &ctx.admin;
    match c {
        Topics::Create { topic } => {
            let t = Topic::parse(&topic)?;
            a.put(&t.path(), None)?;
            done(format!("topic {} created", t.full()))
        }
        Topics::CreatePartitioned { topic, partitions } => {
            let t = Topic::parse(&topic)?;
            a.put(
                &format!("{}/partitions", t.path()),
                Some(&json!(partitions)),
            )?;
            done(format!(
                "partitioned topic {} created with {partitions} partitions",
                t.full()
            ))
        }
        Topics::UpdatePartitions { topic, partitions } => {
            let t = Topic::parse(&topic)?;
            a.post(
                &format!("{}/partitions", t.path()),
                Some(&json!(partitions)),
            )?;
            done(format!(
                "topic {} now has {partitions} partitions",
                t.full()
            ))
        }
        Topics::Partitions { topic } => {
            let t = Topic::parse(&topic)?;
            shown(a.get(&format!("{}/partitions", t.path()))?, View::Object)
        }
        Topics::List {
            namespace,
            partitioned,
            non_persistent,
        } => {
            let (t, n) = parse_ns(&namespace)?;
            let domain = if non_persistent {
                "non-persistent"
            } else {
                "persistent"
            };
            let suffix = if partitioned { "/partitioned" } else { "" };
            shown(
                a.get(&format!(
                    "/admin/v2/{domain}/{}/{}{suffix}",
                    seg(&t),
                    seg(&n)
                ))?,
                View::List("TOPIC"),
            )
        }
        Topics::Delete { topic, force } => {
            let t = Topic::parse(&topic)?;
            let parts = partitions_of(a, &t)?;
            ctx.confirm(&format!("delete topic {}", t.full()))?;
            let q = if force { "?force=true" } else { "" };
            if parts > 0 {
                with_spinner(&format!("deleting {parts} partitions"), || {
                    a.delete(&format!("{}/partitions{q}", t.path()))
                })?;
            } else {
                a.delete(&format!("{}{q}", t.path()))?;
            }
            done(format!("topic {} deleted", t.full()))
        }
        Topics::Stats {
            topic,
            per_partition,
        } => {
            let t = Topic::parse(&topic)?;
            let parts = if t.domain == "persistent" {
                partitions_of(a, &t)?
            } else {
                0
            };
            let v = if parts > 0 {
                let q = if per_partition {
                    "?perPartition=true"
                } else {
                    ""
                };
                a.get(&format!("{}/partitioned-stats{q}", t.path()))?
            } else {
                a.get(&format!("{}/stats", t.path()))?
            };
            shown(v, stats_view_with(per_partition && parts > 0))
        }
        Topics::InternalStats { topic } => {
            let t = Topic::parse(&topic)?;
            let v = a.get(&format!("{}/internalStats", t.path()))?;
            Ok(Shown::Value(
                v,
                View::Sections(vec![
                    ("Managed ledger", SCALARS, View::Object),
                    (
                        "Ledgers",
                        "ledgers",
                        View::Rows(vec![
                            ("LEDGER", "ledgerId"),
                            ("ENTRIES", "entries"),
                            ("SIZE", "size"),
                        ]),
                    ),
                    (
                        "Cursors",
                        "cursors",
                        View::Map(
                            "CURSOR",
                            vec![
                                ("MARK-DELETE", "markDeletePosition"),
                                ("READ", "readPosition"),
                                ("STATE", "state"),
                            ],
                        ),
                    ),
                ]),
            ))
        }
        Topics::LastMessageId { topic } => {
            let t = Topic::parse(&topic)?;
            shown(a.get(&format!("{}/lastMessageId", t.path()))?, View::Object)
        }
        Topics::Peek {
            topic,
            subscription,
            count,
        } => {
            let t = Topic::parse(&topic)?;
            let mut out = Vec::new();
            for n in 1..=count {
                match peek_one(a, &t, &subscription, n)? {
                    Some(m) => out.push(m),
                    None => break,
                }
            }
            shown(
                Value::Array(out),
                View::Rows(vec![
                    ("MESSAGE-ID", "messageId"),
                    ("PUBLISH-TIME", "publishTime"),
                    ("PRODUCER", "producerName"),
                    ("KEY", "key"),
                    ("PAYLOAD", "payload"),
                ]),
            )
        }
        Topics::Unload { topic } => {
            let t = Topic::parse(&topic)?;
            a.put(&format!("{}/unload", t.path()), None)?;
            done(format!("topic {} unloaded", t.full()))
        }
        Topics::Subscriptions { topic } => {
            let t = Topic::parse(&topic)?;
            shown(
                a.get(&format!("{}/subscriptions", t.path()))?,
                View::List("SUBSCRIPTION"),
            )
        }
        Topics::CreateSubscription {
            topic,
            subscription,
            position,
        } => {
            let t = Topic::parse(&topic)?;
            a.put(
                &format!("{}/subscription/{}", t.path(), seg(&subscription)),
                Some(&position_body(position)),
            )?;
            done(format!(
                "subscription {subscription} on {} created",
                t.full()
            ))
        }
        Topics::DeleteSubscription {
            topic,
            subscription,
        } => {
            let t = Topic::parse(&topic)?;
            ctx.confirm(&format!(
                "delete subscription {subscription} of {}",
                t.full()
            ))?;
            a.delete(&format!("{}/subscription/{}", t.path(), seg(&subscription)))?;
            done(format!(
                "subscription {subscription} of {} deleted",
                t.full()
            ))
        }
        Topics::ResetCursor {
            topic,
            subscription,
            position,
            time,
        } => {
            let t = Topic::parse(&topic)?;
            let base = format!(
                "{}/subscription/{}/resetcursor",
                t.path(),
                seg(&subscription)
            );
            match (position, time) {
                (_, Some(ts)) => a.post(&format!("{base}/{ts}"), None)?,
                (Some(p), None) => a.post(&base, Some(&position_body(p)))?,
                (None, None) => {
                    return Err(AdminError::Usage("give --position or --time".to_string()));
                }
            };
            done(format!("cursor of {subscription} on {} reset", t.full()))
        }
        Topics::Skip {
            topic,
            subscription,
            count,
            all,
        } => {
            let t = Topic::parse(&topic)?;
            let base = format!("{}/subscription/{}", t.path(), seg(&subscription));
            if all {
                ctx.confirm(&format!(
                    "clear the whole backlog of {subscription} on {}",
                    t.full()
                ))?;
                with_spinner("clearing the backlog", || {
                    a.post(&format!("{base}/skip_all"), None)
                })?;
                done(format!("backlog of {subscription} cleared"))
            } else {
                let n = count.unwrap_or(0);
                a.post(&format!("{base}/skip/{n}"), None)?;
                done(format!("{n} entries of {subscription} skipped"))
            }
        }
        Topics::Expire {
            topic,
            subscription,
            all_subscriptions: _,
            seconds,
        } => {
            let t = Topic::parse(&topic)?;
            match subscription {
                Some(s) => {
                    a.post(
                        &format!(
                            "{}/subscription/{}/expireMessages/{seconds}",
                            t.path(),
                            seg(&s)
                        ),
                        None,
                    )?;
                    done(format!("messages older than {seconds}s expired on {s}"))
                }
                None => {
                    a.post(
                        &format!("{}/all_subscription/expireMessages/{seconds}", t.path()),
                        None,
                    )?;
                    done(format!(
                        "messages older than {seconds}s expired on every subscription"
                    ))
                }
            }
        }
    }
}

fn queue_path(q: &str) -> AdminResult<(String, String)> {
    let (t, n, name) = parse_three(q, "queue")?;
    Ok((
        format!("/admin/v2/queues/{}/{}/{}", seg(&t), seg(&n), seg(&name)),
        format!("{t}/{n}/{name}"),
    ))
}

fn queues(ctx: &Ctx, c: Queues) -> AdminResult<Shown> {
    let a = &ctx.admin;
    match c {
        Queues::Create {
            queue,
            partitions,
            max_redeliveries,
            dead_letter_topic,
            retention_time_minutes,
            retention_size_mb,
        } => {
            let (p, name) = queue_path(&queue)?;
            let mut body = Map::new();
            body.insert("partitions".into(), json!(partitions));
            if let Some(m) = max_redeliveries {
                body.insert("maxRedeliveries".into(), json!(m));
            }
            if let Some(d) = dead_letter_topic {
                body.insert("deadLetterTopic".into(), json!(d));
            }
            if let (Some(t), Some(s)) = (retention_time_minutes, retention_size_mb) {
                body.insert(
                    "retention".into(),
                    json!({"retentionTimeInMinutes": t, "retentionSizeInMB": s}),
                );
            }
            a.put(&p, Some(&Value::Object(body)))?;
            done(format!("queue {name} created"))
        }
        Queues::List { namespace } => {
            let (t, n) = parse_ns(&namespace)?;
            shown(
                a.get(&format!("/admin/v2/queues/{}/{}", seg(&t), seg(&n)))?,
                View::Rows(vec![
                    ("QUEUE", "name"),
                    ("TOPIC", "topic"),
                    ("BACKLOG", "msgBacklog"),
                ]),
            )
        }
        Queues::Get { queue } => {
            let (p, _) = queue_path(&queue)?;
            shown(a.get(&p)?, View::Object)
        }
        Queues::Stats { queue } => {
            let (p, _) = queue_path(&queue)?;
            let v = a.get(&format!("{p}/stats"))?;
            let parts_key = if v.get("partitions").is_some_and(Value::is_array) {
                "partitions"
            } else {
                "partitionStats"
            };
            Ok(Shown::Value(
                v,
                View::Sections(vec![
                    ("Queue", SCALARS, View::Object),
                    (
                        "Partitions",
                        parts_key,
                        View::Rows(vec![
                            ("TOPIC", "topic"),
                            ("BACKLOG", "msgBacklog"),
                            ("UNACKED", "unackedMessages"),
                            ("CONSUMERS", "consumers"),
                        ]),
                    ),
                ]),
            ))
        }
        Queues::Purge { queue } => {
            let (p, name) = queue_path(&queue)?;
            ctx.confirm(&format!("purge every message of queue {name}"))?;
            with_spinner(&format!("purging {name}"), || {
                a.post(&format!("{p}/purge"), None)
            })?;
            done(format!("queue {name} purged"))
        }
        Queues::Delete { queue, force } => {
            let (p, name) = queue_path(&queue)?;
            ctx.confirm(&format!("delete queue {name}"))?;
            let q = if force { "?force=true" } else { "" };
            with_spinner(&format!("deleting {name}"), || a.delete(&format!("{p}{q}")))?;
            done(format!("queue {name} deleted"))
        }
    }
}

/// `TENANT` or `TENANT/NS` → the quotas path and a label.
fn quota_scope(scope: &str) -> AdminResult<(String, String)> {
    if scope.contains('/') {
        let (t, n) = parse_ns(scope)?;
        Ok((
            format!("{}/quotas", ns_path(&t, &n)),
            format!("namespace {t}/{n}"),
        ))
    } else if scope.is_empty() {
        Err(AdminError::Usage("give TENANT or TENANT/NS".to_string()))
    } else {
        Ok((
            format!("/admin/v2/tenants/{}/quotas", seg(scope)),
            format!("tenant {scope}"),
        ))
    }
}

/// The quota body: only the limits given (absent = unlimited).
pub fn quota_body(q: &QuotaArgs) -> Value {
    let mut m = Map::new();
    let fields = [
        ("publishRateInMsgs", q.publish_rate_msgs),
        ("publishRateInBytes", q.publish_rate_bytes),
        ("dispatchRateInMsgs", q.dispatch_rate_msgs),
        ("dispatchRateInBytes", q.dispatch_rate_bytes),
        ("storageBytes", q.storage_bytes),
        ("maxTopics", q.max_topics),
        ("maxQueues", q.max_queues),
        ("maxProducers", q.max_producers),
        ("maxConsumers", q.max_consumers),
        ("maxConnections", q.max_connections),
    ];
    for (k, v) in fields {
        if let Some(v) = v {
            m.insert(k.to_string(), json!(v));
        }
    }
    Value::Object(m)
}

fn quotas(ctx: &Ctx, c: Quotas) -> AdminResult<Shown> {
    let a = &ctx.admin;
    match c {
        Quotas::Get { scope } => {
            let (p, _) = quota_scope(&scope)?;
            shown(a.get(&p)?, View::Object)
        }
        Quotas::Set { scope, limits } => {
            let (p, label) = quota_scope(&scope)?;
            a.post(&p, Some(&quota_body(&limits)))?;
            done(format!("quotas of {label} set"))
        }
        Quotas::Remove { scope } => {
            let (p, label) = quota_scope(&scope)?;
            ctx.confirm(&format!("remove every quota of {label}"))?;
            a.delete(&p)?;
            done(format!("quotas of {label} removed"))
        }
        Quotas::Usage { scope } => {
            let (p, _) = quota_scope(&scope)?;
            shown(a.get(&format!("{p}/usage"))?, View::Object)
        }
    }
}

fn brokers(ctx: &Ctx, c: Brokers) -> AdminResult<Shown> {
    let a = &ctx.admin;
    match c {
        Brokers::List => shown(
            a.get("/admin/v2/brokers")?,
            View::Rows(vec![
                ("ID", "id"),
                ("SERVICE-URL", "serviceUrl"),
                ("WEB-SERVICE-URL", "webServiceUrl"),
                ("CLUSTER", "cluster"),
            ]),
        ),
        Brokers::Health => shown(a.get("/admin/v2/brokers/health")?, View::Object),
        Brokers::Ownership { namespace } => {
            let (t, n) = parse_ns(&namespace)?;
            shown(
                a.get(&format!("{}/ownership", ns_path(&t, &n)))?,
                View::Rows(vec![
                    ("BUNDLE", "bundle"),
                    ("OWNER", "owner"),
                    ("WEB-SERVICE-URL", "webServiceUrl"),
                ]),
            )
        }
    }
}

const BOOKIE_COLUMNS: [(&str, &str); 6] = [
    ("ID", "id"),
    ("STATE", "state"),
    ("RACK", "rack"),
    ("ENDPOINT", "endpoint"),
    ("FREE-BYTES", "freeBytes"),
    ("TOTAL-BYTES", "totalBytes"),
];

fn bookies(ctx: &Ctx, c: Bookies) -> AdminResult<Shown> {
    let a = &ctx.admin;
    let p = |id: &str| format!("/admin/v2/bookies/{}", seg(id));
    match c {
        Bookies::List => shown(
            a.get("/admin/v2/bookies")?,
            View::Rows(BOOKIE_COLUMNS.to_vec()),
        ),
        Bookies::Get { id } => shown(a.get(&p(&id))?, View::Object),
        Bookies::SetReadonly { id, off } => {
            let v = with_spinner(&format!("waiting for {id} to switch"), || {
                a.put(
                    &format!("{}/readonly", p(&id)),
                    Some(&json!({"readonly": !off})),
                )
            })?;
            shown(v, View::Object)
        }
        Bookies::Decommission {
            id,
            no_wait,
            wait_timeout,
            interval,
        } => {
            ctx.confirm(&format!(
                "decommission bookie {id} (its ledgers are re-replicated elsewhere)"
            ))?;
            decommission(a, &p(&id), no_wait, wait_timeout, interval)
        }
        Bookies::UnderReplicated => shown(
            a.get("/admin/v2/ledgers/underreplicated")?,
            View::Rows(vec![
                ("LEDGER", "ledgerId"),
                ("LOST-BOOKIES", "lostBookies"),
            ]),
        ),
    }
}

fn decommission(
    a: &Admin,
    path: &str,
    no_wait: bool,
    wait_timeout: u64,
    interval: u64,
) -> AdminResult<Shown> {
    let step = || a.post(&format!("{path}/decommission"), None);
    let mut v = step()?;
    if no_wait {
        return shown(v, View::Object);
    }
    let left = |v: &Value| v.get("ledgersLeft").and_then(Value::as_u64).unwrap_or(0);
    let is_done = |v: &Value| v.get("done").and_then(Value::as_bool).unwrap_or(false);
    let start_left = left(&v);
    let pb = if std::io::stderr().is_terminal() {
        let pb = indicatif::ProgressBar::new(start_left);
        if let Ok(style) = indicatif::ProgressStyle::with_template(
            "{spinner} {msg} [{bar:30}] {pos}/{len} ledgers re-replicated ({elapsed})",
        ) {
            pb.set_style(style);
        }
        pb.set_message("decommissioning");
        pb.enable_steady_tick(Duration::from_millis(200));
        Some(pb)
    } else {
        None
    };
    let deadline = Instant::now() + Duration::from_secs(wait_timeout);
    while !is_done(&v) {
        if let Some(pb) = &pb {
            pb.set_position(start_left.saturating_sub(left(&v)));
        }
        if Instant::now() >= deadline {
            if let Some(pb) = &pb {
                pb.abandon();
            }
            return Err(AdminError::Local(format!(
                "decommission not finished after {wait_timeout}s: {} ledgers left (run it again to keep following)",
                left(&v)
            )));
        }
        std::thread::sleep(Duration::from_secs(interval));
        v = step()?;
    }
    if let Some(pb) = pb {
        pb.set_position(start_left);
        pb.finish_and_clear();
    }
    shown(v, View::Object)
}

fn perm_path(resource: &str) -> AdminResult<(String, String)> {
    if resource.contains("://") || resource.matches('/').count() == 2 {
        let t = Topic::parse(resource)?;
        Ok((
            format!("{}/permissions", t.path()),
            format!("topic {}", t.full()),
        ))
    } else {
        let (t, n) = parse_ns(resource)?;
        Ok((
            format!("{}/permissions", ns_path(&t, &n)),
            format!("namespace {t}/{n}"),
        ))
    }
}

fn permissions(ctx: &Ctx, c: Permissions) -> AdminResult<Shown> {
    let a = &ctx.admin;
    match c {
        Permissions::List { resource } => {
            let (p, _) = perm_path(&resource)?;
            shown(a.get(&p)?, View::Object)
        }
        Permissions::Grant {
            resource,
            role,
            actions,
        } => {
            let (p, label) = perm_path(&resource)?;
            let acts: Vec<&str> = actions
                .iter()
                .map(|x| match x {
                    Action::Produce => "produce",
                    Action::Consume => "consume",
                })
                .collect();
            a.post(&format!("{p}/{}", seg(&role)), Some(&json!(acts)))?;
            done(format!("role {role} granted {} on {label}", acts.join(",")))
        }
        Permissions::Revoke { resource, role } => {
            let (p, label) = perm_path(&resource)?;
            a.delete(&format!("{p}/{}", seg(&role)))?;
            done(format!("role {role} revoked on {label}"))
        }
    }
}

fn ledger_view() -> View {
    View::Object
}

fn ledgers(ctx: &Ctx, c: Ledgers) -> AdminResult<Shown> {
    let a = &ctx.admin;
    match c {
        Ledgers::Info { id: Some(id), .. } => {
            shown(a.get(&format!("/admin/v2/ledgers/{id}"))?, ledger_view())
        }
        Ledgers::Info {
            id: None,
            topic: Some(topic),
        } => {
            let t = Topic::parse(&topic)?;
            let stats = a.get(&format!("{}/internalStats", t.path()))?;
            let mut out = Vec::new();
            for l in stats
                .get("ledgers")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
            {
                let Some(id) = l.get("ledgerId").and_then(Value::as_u64) else {
                    continue;
                };
                match a.get(&format!("/admin/v2/ledgers/{id}")) {
                    Ok(md) => out.push(md),
                    // Trimmed between the two calls.
                    Err(AdminError::Http { status: 404, .. }) => {}
                    Err(e) => return Err(e),
                }
            }
            shown(
                Value::Array(out),
                View::Rows(vec![
                    ("LEDGER", "ledgerId"),
                    ("STATE", "state"),
                    ("E", "ensembleSize"),
                    ("QW", "writeQuorum"),
                    ("QA", "ackQuorum"),
                    ("LAST-ENTRY", "lastEntryId"),
                    ("LENGTH", "length"),
                ]),
            )
        }
        Ledgers::Info { .. } => Err(AdminError::Usage("give a ledger id or --topic".to_string())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_parse() {
        assert_eq!(parse_ns("a/b").unwrap(), ("a".into(), "b".into()));
        assert!(parse_ns("a").is_err());
        assert!(parse_ns("a/b/c").is_err());
        assert!(parse_ns("/b").is_err());
        let t = Topic::parse("persistent://a/b/c").unwrap();
        assert_eq!(t.path(), "/admin/v2/persistent/a/b/c");
        assert_eq!(Topic::parse("a/b/c").unwrap(), t);
        let np = Topic::parse("non-persistent://a/b/c").unwrap();
        assert_eq!(np.domain, "non-persistent");
        assert!(Topic::parse("http://a/b/c").is_err());
        assert!(Topic::parse("a/b").is_err());
    }

    #[test]
    fn quota_scope_by_slash() {
        assert_eq!(
            quota_scope("acme").unwrap().0,
            "/admin/v2/tenants/acme/quotas"
        );
        assert_eq!(
            quota_scope("acme/ns").unwrap().0,
            "/admin/v2/namespaces/acme/ns/quotas"
        );
        assert!(quota_scope("a/b/c").is_err());
    }

    #[test]
    fn quota_body_has_only_given_limits() {
        let q = QuotaArgs {
            max_topics: Some(3),
            publish_rate_bytes: Some(10),
            ..QuotaArgs::default()
        };
        assert_eq!(
            quota_body(&q),
            json!({"maxTopics": 3, "publishRateInBytes": 10})
        );
    }

    #[test]
    fn permission_paths() {
        assert_eq!(
            perm_path("a/b").unwrap().0,
            "/admin/v2/namespaces/a/b/permissions"
        );
        assert_eq!(
            perm_path("a/b/c").unwrap().0,
            "/admin/v2/persistent/a/b/c/permissions"
        );
        assert_eq!(
            perm_path("persistent://a/b/c").unwrap().0,
            "/admin/v2/persistent/a/b/c/permissions"
        );
    }

    #[test]
    fn positions_map_to_message_ids() {
        assert_eq!(
            position_body(Position::Earliest),
            json!({"ledgerId": -1, "entryId": -1})
        );
        assert_eq!(
            position_body(Position::At(4, 2)),
            json!({"ledgerId": 4, "entryId": 2})
        );
    }
}

#[cfg(test)]
mod stats_view_tests {
    use super::*;
    use crate::output::{Format, render};

    #[test]
    fn per_partition_stats_get_one_row_per_partition() {
        let v = json!({
            "msgRateIn": 3.0,
            "storageSize": 30,
            "publishers": [],
            "subscriptions": {},
            "partitions": {
                "persistent://t/n/x-partition-0": {"msgRateIn": 1.0, "msgRateOut": 0.5,
                    "msgInCounter": 10, "msgOutCounter": 5, "storageSize": 10},
                "persistent://t/n/x-partition-1": {"msgRateIn": 2.0, "msgRateOut": 0.0,
                    "msgInCounter": 20, "msgOutCounter": 0, "storageSize": 20}
            }
        });
        let out = render(
            &Shown::Value(v.clone(), stats_view_with(true)),
            Format::Table,
        );
        let rows: Vec<Vec<&str>> = out
            .lines()
            .map(|l| l.split_whitespace().collect())
            .collect();
        let at = rows
            .iter()
            .position(|r| r.first() == Some(&"PARTITION"))
            .unwrap_or_else(|| panic!("no partition table:\n{out}"));
        assert_eq!(
            rows[at + 1],
            vec![
                "persistent://t/n/x-partition-0",
                "1.0",
                "0.5",
                "10",
                "5",
                "10"
            ]
        );
        assert_eq!(rows[at + 2][3], "20");
        // Without the flag the table has no partition section.
        let plain = render(&Shown::Value(v, stats_view_with(false)), Format::Table);
        assert!(!plain.contains("PARTITION"), "{plain}");
    }
}
