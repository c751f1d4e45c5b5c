"""Partitioned topics, against a broker whose auto-creation makes new topics
partitioned (3 partitions): the topic is auto-created partitioned
(PARTITIONED_METADATA answers 3); a round-robin producer spreads messages over
every partition and a consumer on the partitioned topic receives them all;
keyed messages keep one partition per key; a pattern subscription
(`re.compile`) picks up the partitions of the matching topics only."""
import re

import pulsar

import compat_util as u

PARTITIONS = 3


def receive_all(consumer, count, timeout_ms):
    got = []
    while len(got) < count:
        m = u.receive_or_none(consumer, timeout_ms)
        if m is None:
            break
        got.append(m)
        consumer.acknowledge(m)
    return got


def main():
    args = u.parse(u.parser(__doc__))
    c = u.Checks()
    client = u.client(args)
    topic = u.topic(args)

    parts = client.get_topic_partitions(topic)
    c.equal("auto-created with the default partition count",
            parts, [f"{topic}-partition-{i}" for i in range(PARTITIONS)])

    consumer = client.subscribe(topic, "all", initial_position=pulsar.InitialPosition.Earliest)
    rr = client.create_producer(
        topic, batching_enabled=False,
        message_routing_mode=pulsar.PartitionsRoutingMode.RoundRobinDistribution)
    sent = [f"rr-{i}" for i in range(30)]
    for s in sent:
        rr.send(s.encode())
    keyed = client.create_producer(topic, batching_enabled=False)
    keys = [f"key-{k}" for k in range(6)]
    for i in range(60):
        body = f"{keys[i % len(keys)]}:{i}"
        keyed.send(body.encode(), partition_key=keys[i % len(keys)])
        sent.append(body)

    got = receive_all(consumer, len(sent), args.timeout_ms)
    bodies = [u.text(m) for m in got]
    c.equal("the consumer on the partitioned topic receives everything once",
            sorted(bodies), sorted(sent))
    rr_parts = {m.topic_name() for m in got if u.text(m).startswith("rr-")}
    c.equal("round robin reaches every partition", sorted(rr_parts), parts)
    by_key = {}
    for m in got:
        body = u.text(m)
        if not body.startswith("rr-"):
            k, seq = body.rsplit(":", 1)
            by_key.setdefault(k, []).append((m.topic_name(), int(seq)))
    for k, msgs in by_key.items():
        c.check(f"{k} stays on one partition", len({t for t, _ in msgs}) == 1,
                partitions=sorted({t for t, _ in msgs}))
        seqs = [s for _, s in msgs]
        c.check(f"{k} in order", seqs == sorted(seqs), seqs=seqs)
    rr.close()
    keyed.close()
    consumer.close()

    # Pattern subscription over topics that exist before it subscribes.
    matching = [u.topic(args, f"-pat-{x}") for x in "ab"]
    other = u.topic(args, "-other")
    for t in matching + [other]:
        p = client.create_producer(t, batching_enabled=False)
        p.send(f"hello {t}".encode())
        p.close()
    pattern = re.compile(re.escape(topic) + "-pat-.*")
    pc = client.subscribe(pattern, "pattern", initial_position=pulsar.InitialPosition.Earliest,
                          pattern_auto_discovery_period=1)
    pgot = receive_all(pc, 2, args.timeout_ms)
    extra = u.drain_quiet(pc, 1000)
    c.equal("the pattern subscription receives the matching topics only",
            sorted(u.text(m) for m in pgot) + extra, sorted(f"hello {t}" for t in matching))
    pc.close()
    client.close()
    u.finish(c, received=len(bodies))


u.run(main)
