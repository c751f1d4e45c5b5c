//! The command line of `cms-admin` (clap derive): global connection and
//! output options, then pulsar-admin's nouns and verbs. Every command's
//! `--help` ends with examples.

use clap::{Args, Parser, Subcommand, ValueEnum};

use crate::output::Format;

/// cms-admin: manage a CMS cluster (tenants, namespaces, topics, queues,
/// quotas, brokers, bookies) through the admin REST API.
#[derive(Debug, Parser)]
#[command(
    name = "cms-admin",
    version,
    after_help = "Examples:
  cms-admin tenants create acme
  cms-admin namespaces create acme/orders
  cms-admin queues create acme/orders/jobs --partitions 4
  cms-admin queues stats acme/orders/jobs -o json
  CMS_ADMIN_URL=https://broker:8443 cms-admin --token-file ~/.cms-token tenants list

Exit codes: 0 ok, 1 refused by the server (400/403) or local error, 2 usage,
3 not found, 4 conflict (409/412), 5 server error (5xx), 6 unreachable or timed out."
)]
pub struct Cli {
    #[command(flatten)]
    pub global: Global,
    #[command(subcommand)]
    pub command: Command,
}

/// Options of every command.
#[derive(Debug, Args)]
pub struct Global {
    /// Admin REST URL of any broker [default: the profile's, else http://localhost:8080]
    #[arg(long, env = "CMS_ADMIN_URL", global = true)]
    pub url: Option<String>,
    /// Profile of the config file to use (default: the file's `default`)
    #[arg(long, env = "CMS_ADMIN_PROFILE", global = true)]
    pub profile: Option<String>,
    /// Config file [default: <config dir>/cms/admin.toml]
    #[arg(long, env = "CMS_ADMIN_CONFIG", global = true)]
    pub config: Option<String>,
    /// Output format
    #[arg(short, long, value_enum, default_value = "table", global = true)]
    pub output: Format,
    /// Bound on each request, in seconds [default: the profile's, else 30]
    #[arg(long, global = true, value_parser = clap::value_parser!(u64).range(1..=3600))]
    pub timeout: Option<u64>,
    /// Bearer token sent as `Authorization: Bearer <token>`
    #[arg(
        long,
        env = "CMS_ADMIN_TOKEN",
        global = true,
        conflicts_with = "token_file",
        hide_env_values = true
    )]
    pub token: Option<String>,
    /// File holding the bearer token
    #[arg(long, global = true)]
    pub token_file: Option<String>,
    /// PEM file of a CA to trust for https:// URLs (besides the system roots)
    #[arg(long, global = true)]
    pub tls_ca_file: Option<String>,
    /// Do not ask before destructive commands (required when stdin is not a terminal)
    #[arg(short = 'y', long, global = true)]
    pub yes: bool,
}

/// The nouns.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// The cluster (created by `cms-broker init-cluster`, not here)
    #[command(subcommand)]
    Clusters(Clusters),
    /// Tenants
    #[command(subcommand)]
    Tenants(Tenants),
    /// Namespaces and their policies
    #[command(subcommand)]
    Namespaces(Namespaces),
    /// Topics and their subscriptions
    #[command(subcommand)]
    Topics(Topics),
    /// Queues (a topic with one Shared subscription named `queue`)
    #[command(subcommand)]
    Queues(Queues),
    /// Resource quotas of a tenant or a namespace
    #[command(subcommand)]
    Quotas(Quotas),
    /// Brokers
    #[command(subcommand)]
    Brokers(Brokers),
    /// Bookies (storage nodes)
    #[command(subcommand)]
    Bookies(Bookies),
    /// Permissions of roles on a namespace or a topic
    #[command(subcommand)]
    Permissions(Permissions),
    /// Ledgers (the storage units of topics)
    #[command(subcommand)]
    Ledgers(Ledgers),
    /// Print a shell completion script
    #[command(after_help = "Examples:
  cms-admin completions bash > /etc/bash_completion.d/cms-admin
  cms-admin completions zsh > ~/.zfunc/_cms-admin")]
    Completions {
        /// The shell
        shell: clap_complete::Shell,
    },
}

#[derive(Debug, Subcommand)]
pub enum Clusters {
    /// List clusters
    #[command(after_help = "Example:\n  cms-admin clusters list")]
    List,
    /// Show a cluster's service URLs
    #[command(after_help = "Example:\n  cms-admin clusters get standalone")]
    Get {
        /// Cluster name
        name: String,
    },
}

#[derive(Debug, Subcommand)]
pub enum Tenants {
    /// Create a tenant
    #[command(after_help = "Examples:
  cms-admin tenants create acme
  cms-admin tenants create acme --admin-roles alice,bob --allowed-clusters standalone")]
    Create {
        /// Tenant name
        name: String,
        #[command(flatten)]
        info: TenantInfo,
    },
    /// List tenants
    #[command(after_help = "Example:\n  cms-admin tenants list -o json")]
    List,
    /// Show a tenant
    #[command(after_help = "Example:\n  cms-admin tenants get acme")]
    Get {
        /// Tenant name
        name: String,
    },
    /// Replace a tenant's admin roles and allowed clusters
    #[command(after_help = "Example:\n  cms-admin tenants update acme --admin-roles carol")]
    Update {
        /// Tenant name
        name: String,
        #[command(flatten)]
        info: TenantInfo,
    },
    /// Delete a tenant (it must have no namespaces)
    #[command(after_help = "Example:\n  cms-admin tenants delete acme --yes")]
    Delete {
        /// Tenant name
        name: String,
    },
}

#[derive(Debug, Args)]
pub struct TenantInfo {
    /// Admin roles, comma-separated
    #[arg(long, value_delimiter = ',')]
    pub admin_roles: Vec<String>,
    /// Allowed clusters, comma-separated (default: this cluster)
    #[arg(long, value_delimiter = ',')]
    pub allowed_clusters: Vec<String>,
}

/// Namespace policies with a get / clear endpoint.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Policy {
    Retention,
    BacklogQuota,
    MessageTtl,
    PublishRate,
    DispatchRate,
    SubscriptionDispatchRate,
    MaxProducersPerTopic,
    MaxConsumersPerTopic,
    MaxConsumersPerSubscription,
    MaxTopicsPerNamespace,
    MaxSubscriptionsPerTopic,
    Deduplication,
    AutoTopicCreation,
    Persistence,
    ReplicationClusters,
    SchemaCompatibilityStrategy,
    IsAllowAutoUpdateSchema,
}

impl Policy {
    /// The REST name (`/admin/v2/namespaces/{t}/{ns}/{policy}`).
    pub fn rest(self) -> &'static str {
        match self {
            Policy::Retention => "retention",
            Policy::BacklogQuota => "backlogQuota",
            Policy::MessageTtl => "messageTTL",
            Policy::PublishRate => "publishRate",
            Policy::DispatchRate => "dispatchRate",
            Policy::SubscriptionDispatchRate => "subscriptionDispatchRate",
            Policy::MaxProducersPerTopic => "maxProducersPerTopic",
            Policy::MaxConsumersPerTopic => "maxConsumersPerTopic",
            Policy::MaxConsumersPerSubscription => "maxConsumersPerSubscription",
            Policy::MaxTopicsPerNamespace => "maxTopicsPerNamespace",
            Policy::MaxSubscriptionsPerTopic => "maxSubscriptionsPerTopic",
            Policy::Deduplication => "deduplication",
            Policy::AutoTopicCreation => "autoTopicCreation",
            Policy::Persistence => "persistence",
            Policy::ReplicationClusters => "replication",
            Policy::SchemaCompatibilityStrategy => "schemaCompatibilityStrategy",
            Policy::IsAllowAutoUpdateSchema => "isAllowAutoUpdateSchema",
        }
    }
}

/// Which count limit a `set-max-*` command sets.
#[derive(Debug, Args)]
pub struct NsCount {
    /// Namespace TENANT/NS
    pub namespace: String,
    /// The limit
    pub value: u32,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum BacklogQuotaType {
    /// Limit on the backlog's size
    DestinationStorage,
    /// Limit on the oldest unacknowledged message's age
    MessageAge,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum BacklogPolicy {
    /// Refuse new messages until the backlog shrinks
    ProducerRequestHold,
    /// Disconnect producers with an exception
    ProducerException,
    /// Drop the oldest backlog
    ConsumerBacklogEviction,
}

#[derive(Debug, Args)]
pub struct DispatchRateArgs {
    /// Namespace TENANT/NS
    pub namespace: String,
    /// Messages per period (-1 = unlimited)
    #[arg(long, default_value_t = -1, allow_negative_numbers = true)]
    pub msgs: i64,
    /// Bytes per period (-1 = unlimited)
    #[arg(long, default_value_t = -1, allow_negative_numbers = true)]
    pub bytes: i64,
    /// Period in seconds
    #[arg(long, default_value_t = 1)]
    pub period: u32,
    /// The rate is relative to the publish rate
    #[arg(long)]
    pub relative_to_publish_rate: bool,
}

#[derive(Debug, Subcommand)]
pub enum Namespaces {
    /// Create a namespace
    #[command(after_help = "Examples:
  cms-admin namespaces create acme/orders
  cms-admin namespaces create acme/orders --bundles 8")]
    Create {
        /// Namespace TENANT/NS
        namespace: String,
        /// Number of bundles (hash ranges spread over brokers) [default: the broker's]
        #[arg(long, value_parser = clap::value_parser!(u32).range(1..=1024))]
        bundles: Option<u32>,
    },
    /// List a tenant's namespaces
    #[command(after_help = "Example:\n  cms-admin namespaces list acme")]
    List {
        /// Tenant
        tenant: String,
    },
    /// Delete a namespace (`--force` deletes its topics and queues too)
    #[command(after_help = "Examples:
  cms-admin namespaces delete acme/orders --yes
  cms-admin namespaces delete acme/orders --force --yes")]
    Delete {
        /// Namespace TENANT/NS
        namespace: String,
        /// Delete its topics and queues as well
        #[arg(long)]
        force: bool,
    },
    /// List a namespace's persistent topics
    #[command(after_help = "Example:\n  cms-admin namespaces topics acme/orders")]
    Topics {
        /// Namespace TENANT/NS
        namespace: String,
    },
    /// Show all of a namespace's policies
    #[command(after_help = "Example:\n  cms-admin namespaces policies acme/orders -o yaml")]
    Policies {
        /// Namespace TENANT/NS
        namespace: String,
    },
    /// Show one policy
    #[command(after_help = "Example:\n  cms-admin namespaces get-policy acme/orders retention")]
    GetPolicy {
        /// Namespace TENANT/NS
        namespace: String,
        /// The policy
        policy: Policy,
    },
    /// Reset one policy to the broker default
    #[command(after_help = "Example:\n  cms-admin namespaces clear-policy acme/orders message-ttl")]
    ClearPolicy {
        /// Namespace TENANT/NS
        namespace: String,
        /// The policy
        policy: Policy,
    },
    /// Show the namespace's bundles (boundaries and count, as stored now)
    #[command(after_help = "Example:\n  cms-admin namespaces bundles acme/orders")]
    Bundles {
        /// Namespace TENANT/NS
        namespace: String,
    },
    /// Split one bundle in two at the middle of its hash range (its owner
    /// does it; topics keep being served)
    #[command(after_help = "Examples:
  cms-admin namespaces split-bundle acme/orders --bundle 0x00000000_0x40000000
  cms-admin namespaces split-bundle acme/orders --bundle 0x00000000_0x40000000 --unload")]
    SplitBundle {
        /// Namespace TENANT/NS
        namespace: String,
        /// The bundle, as `namespaces bundles` / `brokers ownership` name it
        #[arg(long)]
        bundle: String,
        /// Unload both halves afterwards (the next lookups place them again)
        #[arg(long)]
        unload: bool,
    },
    /// Raise the namespace's bundle count to N by splitting its widest
    /// bundles one at a time (bundles are never merged: a lower N is refused)
    #[command(after_help = "Example:\n  cms-admin namespaces set-bundles acme/orders --count 16")]
    SetBundles {
        /// Namespace TENANT/NS
        namespace: String,
        /// Bundle count wanted
        #[arg(long, value_parser = clap::value_parser!(u32).range(1..=1024))]
        count: u32,
    },
    /// Unload a namespace (every bundle) or one bundle: its topics close on
    /// their broker and clients reconnect after a new lookup
    #[command(after_help = "Examples:
  cms-admin namespaces unload acme/orders
  cms-admin namespaces unload acme/orders --bundle 0x40000000_0x80000000")]
    Unload {
        /// Namespace TENANT/NS
        namespace: String,
        /// Only this bundle
        #[arg(long)]
        bundle: Option<String>,
    },
    /// Keep acknowledged messages for a time and/or a size (-1 = unlimited)
    #[command(
        after_help = "Example:\n  cms-admin namespaces set-retention acme/orders --time-minutes 1440 --size-mb 1024"
    )]
    SetRetention {
        /// Namespace TENANT/NS
        namespace: String,
        /// Minutes to keep (-1 = forever, 0 = none)
        #[arg(long, allow_negative_numbers = true)]
        time_minutes: i64,
        /// Megabytes to keep (-1 = unlimited, 0 = none)
        #[arg(long, allow_negative_numbers = true)]
        size_mb: i64,
    },
    /// Limit the backlog of subscriptions
    #[command(after_help = "Examples:
  cms-admin namespaces set-backlog-quota acme/orders --limit-bytes 10737418240 --policy producer-request-hold
  cms-admin namespaces set-backlog-quota acme/orders --type message-age --limit-seconds 3600 --policy consumer-backlog-eviction")]
    SetBacklogQuota {
        /// Namespace TENANT/NS
        namespace: String,
        /// Which quota
        #[arg(long = "type", value_enum, default_value = "destination-storage")]
        kind: BacklogQuotaType,
        /// Size limit in bytes (destination-storage)
        #[arg(long, default_value_t = -1, allow_negative_numbers = true)]
        limit_bytes: i64,
        /// Age limit in seconds (message-age)
        #[arg(long, default_value_t = -1, allow_negative_numbers = true)]
        limit_seconds: i64,
        /// What happens at the limit
        #[arg(long, value_enum)]
        policy: BacklogPolicy,
    },
    /// Expire unacknowledged messages older than a time
    #[command(after_help = "Example:\n  cms-admin namespaces set-message-ttl acme/orders 3600")]
    SetMessageTtl {
        /// Namespace TENANT/NS
        namespace: String,
        /// Seconds
        seconds: u32,
    },
    /// Limit the publish rate per topic
    #[command(
        after_help = "Example:\n  cms-admin namespaces set-publish-rate acme/orders --msgs 1000 --bytes 1048576"
    )]
    SetPublishRate {
        /// Namespace TENANT/NS
        namespace: String,
        /// Messages per second (-1 = unlimited)
        #[arg(long, default_value_t = -1, allow_negative_numbers = true)]
        msgs: i64,
        /// Bytes per second (-1 = unlimited)
        #[arg(long, default_value_t = -1, allow_negative_numbers = true)]
        bytes: i64,
    },
    /// Limit the dispatch rate per topic
    #[command(
        after_help = "Example:\n  cms-admin namespaces set-dispatch-rate acme/orders --msgs 500 --period 1"
    )]
    SetDispatchRate(DispatchRateArgs),
    /// Limit the dispatch rate per subscription
    #[command(
        after_help = "Example:\n  cms-admin namespaces set-subscription-dispatch-rate acme/orders --msgs 100"
    )]
    SetSubscriptionDispatchRate(DispatchRateArgs),
    /// Limit producers per topic
    #[command(
        after_help = "Example:\n  cms-admin namespaces set-max-producers-per-topic acme/orders 10"
    )]
    SetMaxProducersPerTopic(NsCount),
    /// Limit consumers per topic
    #[command(
        after_help = "Example:\n  cms-admin namespaces set-max-consumers-per-topic acme/orders 50"
    )]
    SetMaxConsumersPerTopic(NsCount),
    /// Limit consumers per subscription
    #[command(
        after_help = "Example:\n  cms-admin namespaces set-max-consumers-per-subscription acme/orders 20"
    )]
    SetMaxConsumersPerSubscription(NsCount),
    /// Limit topics in the namespace
    #[command(
        after_help = "Example:\n  cms-admin namespaces set-max-topics-per-namespace acme/orders 1000"
    )]
    SetMaxTopicsPerNamespace(NsCount),
    /// Limit subscriptions per topic
    #[command(
        after_help = "Example:\n  cms-admin namespaces set-max-subscriptions-per-topic acme/orders 16"
    )]
    SetMaxSubscriptionsPerTopic(NsCount),
    /// Turn producer de-duplication on or off
    #[command(
        after_help = "Example:\n  cms-admin namespaces set-deduplication acme/orders --enable"
    )]
    SetDeduplication {
        /// Namespace TENANT/NS
        namespace: String,
        /// Turn it on
        #[arg(long, conflicts_with = "disable", required_unless_present = "disable")]
        enable: bool,
        /// Turn it off
        #[arg(long)]
        disable: bool,
    },
    /// Allow or refuse topics created on first use
    #[command(after_help = "Examples:
  cms-admin namespaces set-auto-topic-creation acme/orders --enable
  cms-admin namespaces set-auto-topic-creation acme/orders --enable --type partitioned --num-partitions 4
  cms-admin namespaces set-auto-topic-creation acme/orders --disable")]
    SetAutoTopicCreation {
        /// Namespace TENANT/NS
        namespace: String,
        /// Allow it
        #[arg(long, conflicts_with = "disable", required_unless_present = "disable")]
        enable: bool,
        /// Refuse it
        #[arg(long)]
        disable: bool,
        /// Topic type: non-partitioned or partitioned
        #[arg(long = "type", default_value = "non-partitioned", value_parser = ["non-partitioned", "partitioned"])]
        topic_type: String,
        /// Partitions of auto-created partitioned topics
        #[arg(long)]
        num_partitions: Option<u32>,
    },
    /// Replication of new ledgers: ensemble, write quorum, ack quorum (E >= Qw >= Qa)
    #[command(
        visible_alias = "set-replication",
        after_help = "Example:\n  cms-admin namespaces set-persistence acme/orders -e 3 -w 3 -a 2"
    )]
    SetPersistence {
        /// Namespace TENANT/NS
        namespace: String,
        /// Ensemble size E (bookies a ledger stripes over)
        #[arg(short = 'e', long)]
        ensemble: u32,
        /// Write quorum Qw (copies of each entry)
        #[arg(short = 'w', long)]
        write_quorum: u32,
        /// Ack quorum Qa (copies fsynced before an ack)
        #[arg(short = 'a', long)]
        ack_quorum: u32,
        /// Mark-delete rate limit per second (stored only)
        #[arg(long, default_value_t = 0.0)]
        mark_delete_rate: f64,
    },
    /// Clusters the namespace is replicated to (this cluster only today)
    #[command(
        after_help = "Example:\n  cms-admin namespaces set-replication-clusters acme/orders standalone"
    )]
    SetReplicationClusters {
        /// Namespace TENANT/NS
        namespace: String,
        /// Cluster names, comma-separated
        #[arg(value_delimiter = ',', required = true)]
        clusters: Vec<String>,
    },
    /// Schema compatibility strategy (FULL, BACKWARD, FORWARD, ..._TRANSITIVE, ALWAYS_COMPATIBLE, ...)
    #[command(
        after_help = "Example:\n  cms-admin namespaces set-schema-compatibility-strategy acme/orders BACKWARD"
    )]
    SetSchemaCompatibilityStrategy {
        /// Namespace TENANT/NS
        namespace: String,
        /// Strategy name
        strategy: String,
    },
    /// Whether producers may add schema versions
    #[command(
        after_help = "Example:\n  cms-admin namespaces set-is-allow-auto-update-schema acme/orders --disable"
    )]
    SetIsAllowAutoUpdateSchema {
        /// Namespace TENANT/NS
        namespace: String,
        /// Allow it
        #[arg(long, conflicts_with = "disable", required_unless_present = "disable")]
        enable: bool,
        /// Refuse it
        #[arg(long)]
        disable: bool,
    },
}

/// A message position argument: `earliest`, `latest` or `LEDGER:ENTRY`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Position {
    /// The first stored message.
    Earliest,
    /// After the last stored message.
    Latest,
    /// A message id.
    At(i64, i64),
}

/// Parses a [`Position`].
pub fn parse_position(s: &str) -> Result<Position, String> {
    match s {
        "earliest" => Ok(Position::Earliest),
        "latest" => Ok(Position::Latest),
        _ => {
            let (l, e) = s
                .split_once(':')
                .ok_or_else(|| format!("{s:?} is not earliest, latest or LEDGER:ENTRY"))?;
            let l = l.parse().map_err(|_| format!("bad ledger id in {s:?}"))?;
            let e = e.parse().map_err(|_| format!("bad entry id in {s:?}"))?;
            Ok(Position::At(l, e))
        }
    }
}

#[derive(Debug, Subcommand)]
pub enum Topics {
    /// Create a non-partitioned topic
    #[command(after_help = "Examples:
  cms-admin topics create persistent://acme/orders/events
  cms-admin topics create acme/orders/events      # persistent:// is the default")]
    Create {
        /// Topic [persistent://]TENANT/NS/TOPIC
        topic: String,
    },
    /// Create a partitioned topic
    #[command(
        after_help = "Example:\n  cms-admin topics create-partitioned persistent://acme/orders/events -p 8"
    )]
    CreatePartitioned {
        /// Topic
        topic: String,
        /// Partitions
        #[arg(short, long, value_parser = clap::value_parser!(u32).range(1..))]
        partitions: u32,
    },
    /// Grow a partitioned topic
    #[command(
        after_help = "Example:\n  cms-admin topics update-partitions persistent://acme/orders/events -p 16"
    )]
    UpdatePartitions {
        /// Topic
        topic: String,
        /// The new, larger, number of partitions
        #[arg(short, long, value_parser = clap::value_parser!(u32).range(1..))]
        partitions: u32,
    },
    /// Show a topic's partition count (0 = not partitioned)
    #[command(
        after_help = "Example:\n  cms-admin topics partitions persistent://acme/orders/events"
    )]
    Partitions {
        /// Topic
        topic: String,
    },
    /// List a namespace's topics
    #[command(after_help = "Examples:
  cms-admin topics list acme/orders
  cms-admin topics list acme/orders --partitioned
  cms-admin topics list acme/orders --non-persistent")]
    List {
        /// Namespace TENANT/NS
        namespace: String,
        /// List partitioned topics (their base names)
        #[arg(long)]
        partitioned: bool,
        /// List non-persistent topics in use
        #[arg(long)]
        non_persistent: bool,
    },
    /// Delete a topic (a partitioned one with all its partitions)
    #[command(after_help = "Examples:
  cms-admin topics delete persistent://acme/orders/events --yes
  cms-admin topics delete persistent://acme/orders/events --force --yes   # disconnects clients")]
    Delete {
        /// Topic
        topic: String,
        /// Disconnect producers and consumers first
        #[arg(long)]
        force: bool,
    },
    /// Show a topic's stats (summed over partitions for a partitioned topic)
    #[command(after_help = "Examples:
  cms-admin topics stats persistent://acme/orders/events
  cms-admin topics stats persistent://acme/orders/events --per-partition -o json")]
    Stats {
        /// Topic
        topic: String,
        /// With each partition's stats (partitioned topics)
        #[arg(long)]
        per_partition: bool,
    },
    /// Show a topic's storage state: ledgers and cursors
    #[command(
        after_help = "Example:\n  cms-admin topics internal-stats persistent://acme/orders/events"
    )]
    InternalStats {
        /// Topic
        topic: String,
    },
    /// Show a topic's last stored message id
    #[command(
        after_help = "Example:\n  cms-admin topics last-message-id persistent://acme/orders/events"
    )]
    LastMessageId {
        /// Topic
        topic: String,
    },
    /// Show messages after a subscription's position without consuming them
    #[command(
        after_help = "Example:\n  cms-admin topics peek persistent://acme/orders/events -s audit -n 5"
    )]
    Peek {
        /// Topic
        topic: String,
        /// Subscription
        #[arg(short, long)]
        subscription: String,
        /// How many messages
        #[arg(short = 'n', long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=1000))]
        count: u32,
    },
    /// Close the topic on its broker; clients reconnect
    #[command(after_help = "Example:\n  cms-admin topics unload persistent://acme/orders/events")]
    Unload {
        /// Topic
        topic: String,
    },
    /// List a topic's durable subscriptions
    #[command(
        after_help = "Example:\n  cms-admin topics subscriptions persistent://acme/orders/events"
    )]
    Subscriptions {
        /// Topic
        topic: String,
    },
    /// Create a durable subscription
    #[command(after_help = "Examples:
  cms-admin topics create-subscription persistent://acme/orders/events -s audit
  cms-admin topics create-subscription persistent://acme/orders/events -s replay --position earliest")]
    CreateSubscription {
        /// Topic
        topic: String,
        /// Subscription
        #[arg(short, long)]
        subscription: String,
        /// Where it starts: earliest, latest or LEDGER:ENTRY
        #[arg(long, default_value = "latest", value_parser = parse_position)]
        position: Position,
    },
    /// Delete a subscription (no consumer may be connected)
    #[command(
        after_help = "Example:\n  cms-admin topics delete-subscription persistent://acme/orders/events -s audit --yes"
    )]
    DeleteSubscription {
        /// Topic
        topic: String,
        /// Subscription
        #[arg(short, long)]
        subscription: String,
    },
    /// Move a subscription's cursor to a message id or a publish time
    #[command(after_help = "Examples:
  cms-admin topics reset-cursor persistent://acme/orders/events -s audit --position earliest
  cms-admin topics reset-cursor persistent://acme/orders/events -s audit --time 1767225600000")]
    ResetCursor {
        /// Topic
        topic: String,
        /// Subscription
        #[arg(short, long)]
        subscription: String,
        /// Message id: earliest, latest or LEDGER:ENTRY
        #[arg(long, value_parser = parse_position, conflicts_with = "time", required_unless_present = "time")]
        position: Option<Position>,
        /// Publish time, milliseconds since the epoch: the first message at or after it
        #[arg(long)]
        time: Option<u64>,
    },
    /// Acknowledge the next N entries of a subscription, or all of its backlog
    #[command(after_help = "Examples:
  cms-admin topics skip persistent://acme/orders/events -s audit -n 100
  cms-admin topics skip persistent://acme/orders/events -s audit --all --yes")]
    Skip {
        /// Topic
        topic: String,
        /// Subscription
        #[arg(short, long)]
        subscription: String,
        /// Entries to skip
        #[arg(
            short = 'n',
            long,
            conflicts_with = "all",
            required_unless_present = "all"
        )]
        count: Option<u64>,
        /// Clear the whole backlog
        #[arg(long)]
        all: bool,
    },
    /// Acknowledge messages published more than SECONDS ago
    #[command(after_help = "Examples:
  cms-admin topics expire persistent://acme/orders/events -s audit -t 3600
  cms-admin topics expire persistent://acme/orders/events --all-subscriptions -t 3600")]
    Expire {
        /// Topic
        topic: String,
        /// Subscription
        #[arg(
            short,
            long,
            conflicts_with = "all_subscriptions",
            required_unless_present = "all_subscriptions"
        )]
        subscription: Option<String>,
        /// Every durable subscription of the topic
        #[arg(long)]
        all_subscriptions: bool,
        /// Age in seconds
        #[arg(short = 't', long)]
        seconds: u64,
    },
}

#[derive(Debug, Subcommand)]
pub enum Queues {
    /// Create a queue
    #[command(after_help = "Examples:
  cms-admin queues create acme/orders/jobs
  cms-admin queues create acme/orders/jobs --partitions 4 --max-redeliveries 5")]
    Create {
        /// Queue TENANT/NS/QUEUE
        queue: String,
        /// Partitions (0 = not partitioned)
        #[arg(long, default_value_t = 0)]
        partitions: u32,
        /// Deliveries before a message goes to the dead-letter topic
        #[arg(long)]
        max_redeliveries: Option<u32>,
        /// Dead-letter topic [default: <queue>-queue-DLQ when --max-redeliveries is set]
        #[arg(long)]
        dead_letter_topic: Option<String>,
        /// Retention minutes (stored with the queue)
        #[arg(long, allow_negative_numbers = true, requires = "retention_size_mb")]
        retention_time_minutes: Option<i64>,
        /// Retention megabytes (stored with the queue)
        #[arg(
            long,
            allow_negative_numbers = true,
            requires = "retention_time_minutes"
        )]
        retention_size_mb: Option<i64>,
    },
    /// List a namespace's queues with their backlog
    #[command(after_help = "Example:\n  cms-admin queues list acme/orders")]
    List {
        /// Namespace TENANT/NS
        namespace: String,
    },
    /// Show a queue's settings
    #[command(after_help = "Example:\n  cms-admin queues get acme/orders/jobs")]
    Get {
        /// Queue TENANT/NS/QUEUE
        queue: String,
    },
    /// Show a queue's backlog and consumers
    #[command(after_help = "Examples:
  cms-admin queues stats acme/orders/jobs
  watch -n 2 cms-admin queues stats acme/orders/jobs")]
    Stats {
        /// Queue TENANT/NS/QUEUE
        queue: String,
    },
    /// Drop every message waiting in the queue
    #[command(after_help = "Example:\n  cms-admin queues purge acme/orders/jobs --yes")]
    Purge {
        /// Queue TENANT/NS/QUEUE
        queue: String,
    },
    /// Delete a queue and its topic
    #[command(after_help = "Examples:
  cms-admin queues delete acme/orders/jobs --yes
  cms-admin queues delete acme/orders/jobs --force --yes   # disconnects clients")]
    Delete {
        /// Queue TENANT/NS/QUEUE
        queue: String,
        /// Disconnect producers and consumers first
        #[arg(long)]
        force: bool,
    },
}

/// Quota limits; an absent flag is unlimited.
#[derive(Debug, Args, Default)]
pub struct QuotaArgs {
    /// Messages per second published
    #[arg(long)]
    pub publish_rate_msgs: Option<u64>,
    /// Bytes per second published
    #[arg(long)]
    pub publish_rate_bytes: Option<u64>,
    /// Messages per second dispatched
    #[arg(long)]
    pub dispatch_rate_msgs: Option<u64>,
    /// Bytes per second dispatched
    #[arg(long)]
    pub dispatch_rate_bytes: Option<u64>,
    /// Bytes stored
    #[arg(long)]
    pub storage_bytes: Option<u64>,
    /// Topics
    #[arg(long)]
    pub max_topics: Option<u64>,
    /// Queues
    #[arg(long)]
    pub max_queues: Option<u64>,
    /// Producers
    #[arg(long)]
    pub max_producers: Option<u64>,
    /// Consumers
    #[arg(long)]
    pub max_consumers: Option<u64>,
    /// Client connections
    #[arg(long)]
    pub max_connections: Option<u64>,
}

#[derive(Debug, Subcommand)]
pub enum Quotas {
    /// Show the quotas of a tenant (TENANT) or a namespace (TENANT/NS)
    #[command(
        after_help = "Examples:\n  cms-admin quotas get acme\n  cms-admin quotas get acme/orders -o json"
    )]
    Get {
        /// TENANT or TENANT/NS
        scope: String,
    },
    /// Set quotas (replaces them all: a limit not given becomes unlimited)
    #[command(after_help = "Examples:
  cms-admin quotas set acme --max-topics 100 --storage-bytes 107374182400
  cms-admin quotas set acme/orders --publish-rate-msgs 5000 --max-producers 20")]
    Set {
        /// TENANT or TENANT/NS
        scope: String,
        #[command(flatten)]
        limits: QuotaArgs,
    },
    /// Remove every quota (unlimited)
    #[command(after_help = "Example:\n  cms-admin quotas remove acme/orders --yes")]
    Remove {
        /// TENANT or TENANT/NS
        scope: String,
    },
    /// Show current usage against the quotas
    #[command(after_help = "Example:\n  cms-admin quotas usage acme")]
    Usage {
        /// TENANT or TENANT/NS
        scope: String,
    },
}

#[derive(Debug, Subcommand)]
pub enum Brokers {
    /// List live brokers
    #[command(after_help = "Example:\n  cms-admin brokers list")]
    List,
    /// Check the answering broker serves
    #[command(after_help = "Example:\n  cms-admin brokers health")]
    Health,
    /// Show which broker owns each bundle of a namespace
    #[command(after_help = "Example:\n  cms-admin brokers ownership acme/orders")]
    Ownership {
        /// Namespace TENANT/NS
        namespace: String,
    },
}

#[derive(Debug, Subcommand)]
pub enum Bookies {
    /// List bookies with state, rack and disk
    #[command(after_help = "Example:\n  cms-admin bookies list")]
    List,
    /// Show one bookie
    #[command(after_help = "Example:\n  cms-admin bookies get b1")]
    Get {
        /// Bookie id
        id: String,
    },
    /// Make a bookie read-only (or writable again with --off)
    #[command(
        after_help = "Examples:\n  cms-admin bookies set-readonly b1\n  cms-admin bookies set-readonly b1 --off"
    )]
    SetReadonly {
        /// Bookie id
        id: String,
        /// Make it writable again
        #[arg(long)]
        off: bool,
    },
    /// Re-replicate a stopped bookie's ledgers elsewhere (follows progress until done unless --no-wait)
    #[command(after_help = "Examples:
  cms-admin bookies decommission b3 --yes
  cms-admin bookies decommission b3 --yes --no-wait -o json   # one step, for scripts")]
    Decommission {
        /// Bookie id (the bookie must be stopped)
        id: String,
        /// Mark its ledgers once and return without following progress
        #[arg(long)]
        no_wait: bool,
        /// Give up following after this many seconds
        #[arg(long, default_value_t = 3600)]
        wait_timeout: u64,
        /// Seconds between progress checks
        #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u64).range(1..=60))]
        interval: u64,
    },
    /// List under-replicated ledgers and their lost bookies
    #[command(after_help = "Example:\n  cms-admin bookies under-replicated")]
    UnderReplicated,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Action {
    /// Publish
    Produce,
    /// Subscribe and consume
    Consume,
}

#[derive(Debug, Subcommand)]
pub enum Permissions {
    /// List roles and their actions on a namespace (TENANT/NS) or a topic
    #[command(after_help = "Examples:
  cms-admin permissions list acme/orders
  cms-admin permissions list persistent://acme/orders/events")]
    List {
        /// TENANT/NS or a topic
        resource: String,
    },
    /// Grant a role actions on a namespace or a topic
    #[command(
        after_help = "Example:\n  cms-admin permissions grant acme/orders --role billing --actions produce,consume"
    )]
    Grant {
        /// TENANT/NS or a topic
        resource: String,
        /// Role
        #[arg(long)]
        role: String,
        /// Actions, comma-separated
        #[arg(long, value_enum, value_delimiter = ',', required = true)]
        actions: Vec<Action>,
    },
    /// Revoke all of a role's actions on a namespace or a topic
    #[command(after_help = "Example:\n  cms-admin permissions revoke acme/orders --role billing")]
    Revoke {
        /// TENANT/NS or a topic
        resource: String,
        /// Role
        #[arg(long)]
        role: String,
    },
}

#[derive(Debug, Subcommand)]
pub enum Ledgers {
    /// Show a ledger's metadata, or those of every ledger of a topic
    #[command(after_help = "Examples:
  cms-admin ledgers info 42
  cms-admin ledgers info --topic persistent://acme/orders/events")]
    Info {
        /// Ledger id
        #[arg(required_unless_present = "topic", conflicts_with = "topic")]
        id: Option<u64>,
        /// The ledgers of this topic
        #[arg(long)]
        topic: Option<String>,
    },
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn the_command_line_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn every_command_has_examples() {
        fn walk(c: &clap::Command, path: &str) {
            let name = format!("{path} {}", c.get_name());
            if c.get_subcommands().next().is_none() {
                let help = c
                    .get_after_help()
                    .map(|h| h.to_string())
                    .unwrap_or_default();
                assert!(help.contains("cms-admin"), "{name} has no example");
            }
            for s in c.get_subcommands() {
                walk(s, &name);
            }
        }
        walk(&Cli::command(), "");
    }

    #[test]
    fn positions_parse() {
        assert_eq!(parse_position("earliest"), Ok(Position::Earliest));
        assert_eq!(parse_position("latest"), Ok(Position::Latest));
        assert_eq!(parse_position("3:-1"), Ok(Position::At(3, -1)));
        assert!(parse_position("3").is_err());
        assert!(parse_position("a:b").is_err());
    }
}
