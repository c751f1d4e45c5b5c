"""Key_Shared: (1) three consumers, keyed messages (unbatched, then in
key-based batches): every key goes to exactly one consumer and each key's
messages arrive in order, every message exactly once, all three take part; a
Shared consumer on the Key_Shared subscription is
refused. (2) a consumer joining and one leaving (with unacknowledged messages
in its receive queue) mid-stream: each key's messages are acknowledged in
order, every message exactly once, nothing lost. (3) STICKY ranges: two
consumers with declared halves get only their keys; an overlapping range is
refused."""
import pulsar

import compat_util as u

KEYS = 20


def murmur3_32(data, seed=0):
    """Murmur3 x86 32 (for the STICKY check: which half a key's hash is in)."""
    c1, c2, mask = 0xCC9E2D51, 0x1B873593, 0xFFFFFFFF
    h = seed
    n = len(data) // 4 * 4
    for i in range(0, n, 4):
        k = int.from_bytes(data[i:i + 4], "little")
        k = (k * c1) & mask
        k = ((k << 15) | (k >> 17)) & mask
        k = (k * c2) & mask
        h ^= k
        h = ((h << 13) | (h >> 19)) & mask
        h = (h * 5 + 0xE6546B64) & mask
    tail = data[n:]
    if tail:
        k = int.from_bytes(tail, "little")
        k = (k * c1) & mask
        k = ((k << 15) | (k >> 17)) & mask
        k = (k * c2) & mask
        h ^= k
    h ^= len(data)
    h ^= h >> 16
    h = (h * 0x85EBCA6B) & mask
    h ^= h >> 13
    h = (h * 0xC2B2AE35) & mask
    h ^= h >> 16
    return h


def sticky_hash(key):
    return (murmur3_32(key.encode()) & 0x7FFFFFFF) % 65536


def key_shared(client, topic, sub, name, policy=None):
    return client.subscribe(topic, sub, consumer_type=pulsar.ConsumerType.KeyShared,
                            consumer_name=name, receiver_queue_size=10,
                            initial_position=pulsar.InitialPosition.Earliest,
                            key_shared_policy=policy)


def send(producer, start, count):
    sent = []
    for i in range(start, start + count):
        key = f"key-{i % KEYS}"
        body = f"{key}:{i}"
        producer.send(body.encode(), partition_key=key)
        sent.append(body)
    return sent


def poll(consumers, got, until, timeout_ms):
    """Receives (and acks at once) round-robin over `consumers` until
    `until()` or a whole receive timeout passes without a message."""
    last_progress = u.now_ms()
    while not until() and u.now_ms() - last_progress < timeout_ms:
        for name, consumer in consumers:
            m = u.receive_or_none(consumer, 5)
            if m is not None:
                got.append((name, u.text(m)))
                consumer.acknowledge(m)
                last_progress = u.now_ms()


def per_key(got):
    out = {}
    for name, body in got:
        key, seq = body.rsplit(":", 1)
        out.setdefault(key, []).append((name, int(seq)))
    return out


def spread_and_order(c, client, topic, timeout_ms):
    consumers = [(f"ks-{i}", key_shared(client, topic, "ks", f"ks-{i}")) for i in range(3)]
    try:
        client.subscribe(topic, "ks", consumer_type=pulsar.ConsumerType.Shared,
                         consumer_name="intruder")
        c.check("a Shared consumer on a Key_Shared subscription is refused", False)
    except pulsar.PulsarException:
        pass
    producer = client.create_producer(topic, batching_enabled=False)
    sent = send(producer, 0, 300)
    got = []
    poll(consumers, got, lambda: len(got) >= len(sent), timeout_ms)
    extra = [u.drain_quiet(cons, 500) for _, cons in consumers]
    c.equal("spread: every message exactly once", sorted(b for _, b in got) + sum(extra, []),
            sorted(sent))
    for key, msgs in per_key(got).items():
        owners = {n for n, _ in msgs}
        c.check(f"spread: {key} went to one consumer", len(owners) == 1, owners=sorted(owners))
        seqs = [s for _, s in msgs]
        c.check(f"spread: {key} in order", seqs == sorted(seqs), seqs=seqs)
    counts = {n: sum(1 for g, _ in got if g == n) for n, _ in consumers}
    c.check("spread: all three consumers take part", all(v > 0 for v in counts.values()),
            counts=counts)
    producer.close()
    # Key-based batches: every batch holds one key, so keys stay whole.
    batched = client.create_producer(topic, batching_enabled=True,
                                     batching_type=pulsar.BatchingType.KeyBased,
                                     batching_max_messages=10,
                                     batching_max_publish_delay_ms=20)
    bsent = []
    for i in range(300, 500):
        key = f"key-{i % KEYS}"
        body = f"{key}:{i}"
        batched.send_async(body.encode(), None, partition_key=key)
        bsent.append(body)
    batched.flush()
    bgot = []
    poll(consumers, bgot, lambda: len(bgot) >= len(bsent), timeout_ms)
    c.equal("batched: every message exactly once", sorted(b for _, b in bgot), sorted(bsent))
    for key, msgs in per_key(bgot).items():
        owners = {n for n, _ in msgs}
        c.check(f"batched: {key} went to one consumer", len(owners) == 1,
                owners=sorted(owners))
        seqs = [s for _, s in msgs]
        c.check(f"batched: {key} in order", seqs == sorted(seqs), seqs=seqs)
    batched.close()
    for _, cons in consumers:
        cons.close()
    return counts


def join_and_leave(c, client, topic, timeout_ms):
    a = ("a", key_shared(client, topic, "ks", "ks-a"))
    b = ("b", key_shared(client, topic, "ks", "ks-b"))
    producer = client.create_producer(topic, batching_enabled=False)
    sent = send(producer, 0, 100)
    got = []
    poll([a, b], got, lambda: len(got) >= 40, timeout_ms)
    # A newcomer takes hashes over while a and b hold unacked messages.
    cc = ("c", key_shared(client, topic, "ks", "ks-c"))
    sent += send(producer, 100, 100)
    poll([a, b, cc], got, lambda: len(got) >= 120, timeout_ms)
    # b leaves with messages still in its receive queue (never acked).
    b[1].close()
    sent += send(producer, 200, 100)
    poll([a, cc], got, lambda: len(got) >= len(sent), timeout_ms)
    extra = [u.drain_quiet(cons, 500) for _, cons in (a, cc)]
    c.equal("join/leave: every message acked exactly once",
            sorted(bd for _, bd in got) + sum(extra, []), sorted(sent))
    for key, msgs in per_key(got).items():
        seqs = [s for _, s in msgs]
        c.check(f"join/leave: {key} acked in order", seqs == sorted(seqs), seqs=seqs)
    counts = {n: sum(1 for g, _ in got if g == n) for n in "abc"}
    c.check("join/leave: the newcomer received messages", counts["c"] > 0, counts=counts)
    producer.close()
    for _, cons in (a, cc):
        cons.close()
    return counts


def sticky(c, client, topic, timeout_ms):
    halves = {"low": [(0, 32767)], "high": [(32768, 65535)]}
    consumers = [
        (n, key_shared(client, topic, "sticky", f"sticky-{n}",
                       pulsar.ConsumerKeySharedPolicy(pulsar.KeySharedMode.Sticky,
                                                      sticky_ranges=r)))
        for n, r in halves.items()
    ]
    try:
        key_shared(client, topic, "sticky", "sticky-clash",
                   pulsar.ConsumerKeySharedPolicy(pulsar.KeySharedMode.Sticky,
                                                  sticky_ranges=[(30000, 40000)]))
        c.check("sticky: an overlapping range is refused", False)
    except pulsar.PulsarException:
        pass
    producer = client.create_producer(topic, batching_enabled=False)
    sent = send(producer, 0, 100)
    got = []
    poll(consumers, got, lambda: len(got) >= len(sent), timeout_ms)
    c.equal("sticky: every message once", sorted(b for _, b in got), sorted(sent))
    for name, body in got:
        key = body.rsplit(":", 1)[0]
        want = "low" if sticky_hash(key) < 32768 else "high"
        c.check(f"sticky: {key} to its range's consumer", name == want, got=name, want=want)
    producer.close()
    for _, cons in consumers:
        cons.close()


def main():
    args = u.parse(u.parser(__doc__))
    c = u.Checks()
    client = u.client(args)
    spread = spread_and_order(c, client, u.topic(args, "-spread"), args.timeout_ms)
    moves = join_and_leave(c, client, u.topic(args, "-moves"), args.timeout_ms)
    sticky(c, client, u.topic(args, "-sticky"), args.timeout_ms)
    client.close()
    u.finish(c, spread=spread, moves=moves)


u.run(main)
