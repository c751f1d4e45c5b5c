//! How clients discover topics (issue 8 item 2): PARTITIONED_METADATA
//! (the stored partition count, auto-creating a partitioned topic when the
//! namespace's auto-creation says so), GET_TOPICS_OF_NAMESPACE (persistent
//! topics and the partitions of partitioned topics, filtered by the
//! client's pattern, with Pulsar's topics hash), and the rule on which names
//! producers and consumers may use.
//!
//! Promises:
//! - PARTITIONED_METADATA answers `n` for a partitioned topic and 0 for
//!   anything else (including a partition name and a missing topic that
//!   auto-creation would make non-partitioned); it creates the partitioned
//!   metadata only if the topic does not exist as a non-partitioned topic
//!   and auto-creation is on with type `partitioned`;
//! - producers and consumers on a partitioned topic's base name are refused
//!   (they must use `<topic>-partition-<i>`), and on a partition index at or
//!   beyond the count;
//! - a topic list never exceeds [`TOPIC_LIST_BYTES_MAX`] bytes of names
//!   (a larger namespace is an error, not a truncated list); a pattern is
//!   applied only if it compiles and is at most [`PATTERN_BYTES_MAX`] bytes,
//!   otherwise the full list goes back with `filtered=false` and the client
//!   filters.

use std::collections::BTreeSet;

use cms_bookie::metadata::layout::Layout;
use cms_bookie::metadata::{MetadataError, MetadataStore, join};
use cms_client::proto::pulsar::ServerError;

use crate::connection::ErrorReply;
use crate::partitioned::{self, PartitionedError, partition_name, partition_of};
use crate::tenancy::{AutoCreation, AutoTopicType, namespace_policies};
use crate::topic_name::{Domain, TopicName};

/// Bytes of topic names one GET_TOPICS_OF_NAMESPACE answer may carry.
pub const TOPIC_LIST_BYTES_MAX: usize = 4 * 1024 * 1024;

/// Longest pattern the broker evaluates (longer ones are left to the
/// client, as Pulsar's `subscriptionPatternMaxLength`).
pub const PATTERN_BYTES_MAX: usize = 1024;

/// Which topics GET_TOPICS_OF_NAMESPACE lists (Pulsar `Mode`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ListMode {
    /// `persistent://` topics.
    Persistent,
    /// `non-persistent://` topics: those in use on this broker plus the
    /// partitions of partitioned ones.
    NonPersistent,
    /// Both.
    All,
}

impl ListMode {
    /// From the wire value (unknown or absent = PERSISTENT, Pulsar's default).
    pub fn from_wire(mode: Option<i32>) -> Self {
        match mode {
            Some(1) => Self::NonPersistent,
            Some(2) => Self::All,
            _ => Self::Persistent,
        }
    }
}

/// The answer to GET_TOPICS_OF_NAMESPACE.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TopicList {
    /// Full topic names, sorted (empty when `changed` is false).
    pub topics: Vec<String>,
    /// Whether the pattern was applied here.
    pub filtered: bool,
    /// Pulsar's hash of the (filtered) list.
    pub hash: String,
    /// False when the client's hash equals ours (the list is left out).
    pub changed: bool,
}

fn metadata_reply(e: impl std::fmt::Display) -> ErrorReply {
    (ServerError::MetadataError, e.to_string())
}

fn partitioned_reply(e: PartitionedError) -> ErrorReply {
    match e {
        PartitionedError::Invalid(m) => (ServerError::NotAllowedError, m),
        e => metadata_reply(e),
    }
}

/// Pulsar's `TopicList.calculateHash`: CRC32C over the names in order,
/// printed as Guava's `HashCode.toString` (the hash's little-endian bytes
/// in hex).
pub fn topics_hash(topics: &[String]) -> String {
    let mut crc = 0u32;
    for t in topics {
        crc = crc32c::crc32c_append(crc, t.as_bytes());
    }
    crc.to_le_bytes()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// Pulsar's `TopicList.filterTopics`: full matches of `pattern` against the
/// names, both without their `persistent://` / `non-persistent://` scheme.
/// `None` if the pattern is too long or does not compile.
pub fn filter_topics(topics: &[String], pattern: &str) -> Option<Vec<String>> {
    if pattern.len() > PATTERN_BYTES_MAX {
        return None;
    }
    let strip = |s: &str| -> String {
        s.split_once("://")
            .map_or_else(|| s.to_string(), |(_, rest)| rest.to_string())
    };
    let re = regex::Regex::new(&format!("^(?:{})$", strip(pattern))).ok()?;
    Some(
        topics
            .iter()
            .filter(|t| re.is_match(&strip(t)))
            .cloned()
            .collect(),
    )
}

/// Builds the answer from the namespace's topics (any order).
pub fn answer(
    mut topics: Vec<String>,
    pattern: Option<&str>,
    client_hash: Option<&str>,
) -> TopicList {
    topics.sort();
    topics.dedup();
    let (topics, filtered) = match pattern.and_then(|p| filter_topics(&topics, p)) {
        Some(f) => (f, true),
        None => (topics, false),
    };
    let hash = topics_hash(&topics);
    let changed = client_hash != Some(hash.as_str());
    TopicList {
        topics: if changed { topics } else { Vec::new() },
        filtered,
        hash,
        changed,
    }
}

/// The persistent topics of `tenant/ns`: stored managed ledgers plus every
/// partition of every partitioned topic.
pub async fn persistent_topics(
    store: &dyn MetadataStore,
    layout: &Layout,
    tenant: &str,
    namespace: &str,
) -> Result<Vec<String>, ErrorReply> {
    let dir = join(
        &join(&join(&layout.managed_ledgers(), tenant), namespace),
        "persistent",
    );
    let stored = match store.children(&dir).await {
        Ok(c) => c,
        Err(MetadataError::NoNode(_)) => Vec::new(),
        Err(e) => return Err(metadata_reply(e)),
    };
    let mut names: BTreeSet<String> = BTreeSet::new();
    let mut bytes = 0usize;
    let mut push = |name: String| -> Result<(), ErrorReply> {
        bytes += name.len();
        if bytes > TOPIC_LIST_BYTES_MAX {
            return Err((
                ServerError::NotAllowedError,
                format!(
                    "namespace {tenant}/{namespace} has more topics than one answer may carry \
                     ({TOPIC_LIST_BYTES_MAX} bytes of names)"
                ),
            ));
        }
        names.insert(name);
        Ok(())
    };
    for local in stored {
        push(format!("persistent://{tenant}/{namespace}/{local}"))?;
    }
    let parts = partitioned::list(store, layout, tenant, namespace, Domain::Persistent)
        .await
        .map_err(partitioned_reply)?;
    for base in parts {
        let n = partitioned::partitions(store, layout, &base)
            .await
            .map_err(partitioned_reply)?
            .unwrap_or(0);
        for i in 0..n {
            push(partition_name(&base, i).to_string())?;
        }
    }
    Ok(names.into_iter().collect())
}

/// The non-persistent topics of `tenant/ns`: `in_use` (the broker's loaded
/// ones, any namespace; filtered here) plus every partition of every
/// partitioned non-persistent topic.
pub async fn non_persistent_topics(
    store: &dyn MetadataStore,
    layout: &Layout,
    tenant: &str,
    namespace: &str,
    in_use: &[TopicName],
) -> Result<Vec<String>, ErrorReply> {
    let mut names: BTreeSet<String> = in_use
        .iter()
        .filter(|n| {
            n.domain == Domain::NonPersistent && n.tenant == tenant && n.namespace == namespace
        })
        .map(ToString::to_string)
        .collect();
    let parts = partitioned::list(store, layout, tenant, namespace, Domain::NonPersistent)
        .await
        .map_err(partitioned_reply)?;
    let mut bytes: usize = names.iter().map(String::len).sum();
    for base in parts {
        let n = partitioned::partitions(store, layout, &base)
            .await
            .map_err(partitioned_reply)?
            .unwrap_or(0);
        for i in 0..n {
            let name = partition_name(&base, i).to_string();
            bytes += name.len();
            if bytes > TOPIC_LIST_BYTES_MAX {
                return Err((
                    ServerError::NotAllowedError,
                    format!(
                        "namespace {tenant}/{namespace} has more topics than one answer may carry \
                         ({TOPIC_LIST_BYTES_MAX} bytes of names)"
                    ),
                ));
            }
            names.insert(name);
        }
    }
    Ok(names.into_iter().collect())
}

/// Parses `tenant/ns` (Pulsar's v2 namespace name).
pub fn parse_namespace(ns: &str) -> Result<(String, String), ErrorReply> {
    match ns.split('/').collect::<Vec<_>>().as_slice() {
        [t, n] if !t.is_empty() && !n.is_empty() => Ok(((*t).to_string(), (*n).to_string())),
        _ => Err((
            ServerError::InvalidTopicName,
            format!("invalid namespace {ns:?}: expected tenant/namespace"),
        )),
    }
}

/// GET_TOPICS_OF_NAMESPACE, without non-persistent topics in use (see
/// [`topics_of_namespace_with`]).
pub async fn topics_of_namespace(
    store: &dyn MetadataStore,
    layout: &Layout,
    namespace: &str,
    mode: ListMode,
    pattern: Option<&str>,
    client_hash: Option<&str>,
) -> Result<TopicList, ErrorReply> {
    topics_of_namespace_with(store, layout, namespace, mode, pattern, client_hash, &[]).await
}

/// GET_TOPICS_OF_NAMESPACE; `np_in_use`: the non-persistent topics loaded
/// on this broker (listed in modes NON_PERSISTENT and ALL).
pub async fn topics_of_namespace_with(
    store: &dyn MetadataStore,
    layout: &Layout,
    namespace: &str,
    mode: ListMode,
    pattern: Option<&str>,
    client_hash: Option<&str>,
    np_in_use: &[TopicName],
) -> Result<TopicList, ErrorReply> {
    let (tenant, ns) = parse_namespace(namespace)?;
    match namespace_policies(store, layout, &tenant, &ns).await {
        Ok(Some(_)) => {}
        Ok(None) => {
            return Err((
                ServerError::TopicNotFound,
                format!("namespace {tenant}/{ns} does not exist"),
            ));
        }
        Err(e) => return Err(metadata_reply(e)),
    }
    let mut topics = Vec::new();
    if matches!(mode, ListMode::Persistent | ListMode::All) {
        topics.extend(persistent_topics(store, layout, &tenant, &ns).await?);
    }
    if matches!(mode, ListMode::NonPersistent | ListMode::All) {
        topics.extend(non_persistent_topics(store, layout, &tenant, &ns, np_in_use).await?);
    }
    Ok(answer(topics, pattern, client_hash))
}

/// PARTITIONED_METADATA for `name`: its partition count, 0 if not
/// partitioned; a missing topic is created partitioned when the namespace's
/// auto-creation (over `broker_auto`) says so and `may_create` (the
/// client's `metadata_auto_creation_enabled`, default true).
pub async fn partition_count(
    store: &dyn MetadataStore,
    layout: &Layout,
    name: &TopicName,
    broker_auto: AutoCreation,
    may_create: bool,
) -> Result<u32, ErrorReply> {
    let policies = match namespace_policies(store, layout, &name.tenant, &name.namespace).await {
        Ok(Some(p)) => p,
        Ok(None) => {
            return Err((
                ServerError::TopicNotFound,
                format!("namespace {} does not exist", name.namespace_name()),
            ));
        }
        Err(e) => return Err(metadata_reply(e)),
    };
    if partition_of(name).is_some() {
        return Ok(0);
    }
    if let Some(n) = partitioned::partitions(store, layout, name)
        .await
        .map_err(partitioned_reply)?
    {
        return Ok(n);
    }
    let auto = policies.auto_creation(broker_auto);
    if !may_create || !auto.allowed || auto.topic_type != AutoTopicType::Partitioned {
        return Ok(0);
    }
    // A non-persistent topic is never stored: only its partitioned
    // metadata says what it is (one in use as non-partitioned is not seen
    // here, as in Pulsar before it is first listed).
    if name.domain != Domain::Persistent {
        return create_partitioned(store, layout, name, auto.partitions).await;
    }
    // An existing non-partitioned topic stays what it is.
    let ml_path =
        crate::managed_ledger::io::managed_ledger::node_path(layout, &name.managed_ledger_name())
            .map_err(|e| (ServerError::InvalidTopicName, e.to_string()))?;
    match store.exists(&ml_path).await {
        Ok(Some(_)) => return Ok(0),
        Ok(None) | Err(MetadataError::NoNode(_)) => {}
        Err(e) => return Err(metadata_reply(e)),
    }
    create_partitioned(store, layout, name, auto.partitions).await
}

async fn create_partitioned(
    store: &dyn MetadataStore,
    layout: &Layout,
    name: &TopicName,
    partitions: u32,
) -> Result<u32, ErrorReply> {
    match partitioned::create(store, layout, name, partitions).await {
        Ok(()) => {
            tracing::info!(tenant = %name.tenant, namespace = %name.namespace, topic = %name,
                partitions, "partitioned topic auto-created");
            Ok(partitions)
        }
        // Created concurrently: answer what is stored.
        Err(PartitionedError::AlreadyExists(_)) => Ok(partitioned::partitions(store, layout, name)
            .await
            .map_err(partitioned_reply)?
            .unwrap_or(0)),
        Err(e) => Err(partitioned_reply(e)),
    }
}

/// Refuses producers and consumers on a partitioned topic's base name and
/// on a partition index beyond its count.
pub async fn check_use(
    store: &dyn MetadataStore,
    layout: &Layout,
    name: &TopicName,
) -> Result<(), ErrorReply> {
    if let Some((base, index)) = partition_of(name) {
        if let Some(n) = partitioned::partitions(store, layout, &base)
            .await
            .map_err(partitioned_reply)?
            && index >= n
        {
            return Err((
                ServerError::TopicNotFound,
                format!("{name} does not exist: {base} has {n} partitions"),
            ));
        }
        return Ok(());
    }
    match partitioned::partitions(store, layout, name)
        .await
        .map_err(partitioned_reply)?
    {
        Some(n) => Err((
            ServerError::NotAllowedError,
            format!(
                "{name} is a partitioned topic ({n} partitions): use its partitions \
                 {name}-partition-<i>"
            ),
        )),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| (*s).to_string()).collect()
    }

    #[test]
    fn patterns_match_whole_names_without_the_scheme() {
        let all = names(&[
            "persistent://public/default/orders-1",
            "persistent://public/default/orders-2-partition-0",
            "persistent://public/default/other",
            "persistent://public/default/xorders-1",
        ]);
        assert_eq!(
            filter_topics(&all, "persistent://public/default/orders-.*"),
            Some(names(&[
                "persistent://public/default/orders-1",
                "persistent://public/default/orders-2-partition-0"
            ]))
        );
        assert_eq!(
            filter_topics(&all, "public/default/other"),
            Some(names(&["persistent://public/default/other"]))
        );
        assert_eq!(
            filter_topics(&all, "persistent://public/default/(unclosed"),
            None
        );
        assert_eq!(
            filter_topics(&all, &"a".repeat(PATTERN_BYTES_MAX + 1)),
            None
        );
    }

    #[test]
    fn answers_carry_the_hash_and_skip_an_unchanged_list() {
        let all = names(&["persistent://a/b/y", "persistent://a/b/x"]);
        let a = answer(all.clone(), None, None);
        assert_eq!(
            a.topics,
            names(&["persistent://a/b/x", "persistent://a/b/y"])
        );
        assert!(!a.filtered && a.changed);
        assert_eq!(a.hash.len(), 8);
        let again = answer(all.clone(), None, Some(&a.hash));
        assert!(!again.changed && again.topics.is_empty());
        let f = answer(all, Some("persistent://a/b/x"), Some(&a.hash));
        assert!(f.filtered && f.changed);
        assert_eq!(f.topics, names(&["persistent://a/b/x"]));
        assert_ne!(f.hash, a.hash);
        // CRC32C("") = 0; the hash of no topics is all zeros.
        assert_eq!(topics_hash(&[]), "00000000");
    }

    #[tokio::test]
    async fn partition_counts_auto_creation_listing_and_use() {
        use cms_bookie::metadata::CreateMode;
        use cms_bookie::metadata::embedded::EmbeddedStore;
        let dir = tempfile::tempdir().unwrap();
        let store = EmbeddedStore::open(&dir.path().join("m.redb"))
            .await
            .unwrap();
        let layout = Layout::new("/cms").unwrap();
        crate::tenancy::init_cluster(&store, &layout, "c")
            .await
            .unwrap();
        let t = |s: &str| TopicName::parse(s).unwrap();
        let plain = AutoCreation {
            allowed: true,
            topic_type: AutoTopicType::NonPartitioned,
            partitions: 1,
        };
        let parted = AutoCreation {
            topic_type: AutoTopicType::Partitioned,
            partitions: 4,
            ..plain
        };
        let count = |name: &str, auto| {
            let name = t(name);
            let (store, layout) = (&store, &layout);
            async move { partition_count(store, layout, &name, auto, true).await }
        };
        // The client may forbid creation.
        assert_eq!(
            partition_count(
                &store,
                &layout,
                &t("persistent://public/default/p"),
                parted,
                false
            )
            .await,
            Ok(0)
        );
        // Missing + non-partitioned auto-creation: 0, nothing created.
        assert_eq!(count("persistent://public/default/a", plain).await, Ok(0));
        assert_eq!(
            partitioned::partitions(&store, &layout, &t("persistent://public/default/a"))
                .await
                .unwrap(),
            None
        );
        // Missing + partitioned: created with the default count, stable.
        assert_eq!(count("persistent://public/default/p", parted).await, Ok(4));
        assert_eq!(count("persistent://public/default/p", plain).await, Ok(4));
        // A partition name, or an existing non-partitioned topic: 0.
        assert_eq!(
            count("persistent://public/default/p-partition-1", parted).await,
            Ok(0)
        );
        let ml =
            crate::managed_ledger::io::managed_ledger::node_path(&layout, "public/default/stored")
                .unwrap();
        store
            .create_all(cms_bookie::metadata::parent_of(&ml).unwrap())
            .await
            .unwrap();
        store
            .create(&ml, b"", CreateMode::Persistent)
            .await
            .unwrap();
        assert_eq!(
            count("persistent://public/default/stored", parted).await,
            Ok(0)
        );
        // Unknown namespace.
        assert_eq!(
            count("persistent://public/nope/x", parted)
                .await
                .map_err(|e| e.0),
            Err(ServerError::TopicNotFound)
        );
        // Which names clients may use.
        let using = |name: &str| {
            let name = t(name);
            let (store, layout) = (&store, &layout);
            async move { check_use(store, layout, &name).await.map_err(|e| e.0) }
        };
        assert_eq!(
            using("persistent://public/default/p").await,
            Err(ServerError::NotAllowedError)
        );
        assert_eq!(
            using("persistent://public/default/p-partition-3").await,
            Ok(())
        );
        assert_eq!(
            using("persistent://public/default/p-partition-4").await,
            Err(ServerError::TopicNotFound)
        );
        assert_eq!(using("persistent://public/default/stored").await, Ok(()));
        assert_eq!(
            using("persistent://public/default/q-partition-9").await,
            Ok(())
        );
        // Listing: stored topics plus every partition; patterns; modes.
        let list =
            topics_of_namespace(&store, &layout, "public/default", ListMode::All, None, None)
                .await
                .unwrap();
        assert_eq!(
            list.topics,
            names(&[
                "persistent://public/default/p-partition-0",
                "persistent://public/default/p-partition-1",
                "persistent://public/default/p-partition-2",
                "persistent://public/default/p-partition-3",
                "persistent://public/default/stored",
            ])
        );
        let np = topics_of_namespace(
            &store,
            &layout,
            "public/default",
            ListMode::NonPersistent,
            None,
            None,
        )
        .await
        .unwrap();
        assert!(np.topics.is_empty());
        // Non-persistent: partitioned metadata is stored (auto-created when
        // partitioned), its partitions and the topics in use are listed.
        assert_eq!(
            count("non-persistent://public/default/np", parted).await,
            Ok(4)
        );
        assert_eq!(
            count("non-persistent://public/default/np", plain).await,
            Ok(4)
        );
        assert_eq!(
            count("non-persistent://public/default/flat", plain).await,
            Ok(0)
        );
        assert_eq!(
            using("non-persistent://public/default/np").await,
            Err(ServerError::NotAllowedError)
        );
        let in_use = [
            t("non-persistent://public/default/live"),
            t("non-persistent://other/ns/elsewhere"),
        ];
        let np = topics_of_namespace_with(
            &store,
            &layout,
            "public/default",
            ListMode::NonPersistent,
            None,
            None,
            &in_use,
        )
        .await
        .unwrap();
        assert_eq!(
            np.topics,
            names(&[
                "non-persistent://public/default/live",
                "non-persistent://public/default/np-partition-0",
                "non-persistent://public/default/np-partition-1",
                "non-persistent://public/default/np-partition-2",
                "non-persistent://public/default/np-partition-3",
            ])
        );
        let f = topics_of_namespace(
            &store,
            &layout,
            "public/default",
            ListMode::Persistent,
            Some("persistent://public/default/st.*"),
            None,
        )
        .await
        .unwrap();
        assert_eq!(f.topics, names(&["persistent://public/default/stored"]));
        assert!(
            topics_of_namespace(&store, &layout, "public/nope", ListMode::All, None, None)
                .await
                .is_err()
        );
    }

    #[test]
    fn modes_and_namespaces_parse() {
        assert_eq!(ListMode::from_wire(None), ListMode::Persistent);
        assert_eq!(ListMode::from_wire(Some(1)), ListMode::NonPersistent);
        assert_eq!(ListMode::from_wire(Some(2)), ListMode::All);
        assert_eq!(
            parse_namespace("public/default").ok(),
            Some(("public".to_string(), "default".to_string()))
        );
        for bad in ["public", "/x", "a/b/c", ""] {
            assert!(parse_namespace(bad).is_err(), "{bad}");
        }
    }
}
