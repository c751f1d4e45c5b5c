"""Non-persistent topic fan-out.

--mode fanout: subscriptions `shared` (Shared, two consumers), `excl`
(Exclusive) and `slow` (receiver queue of 1, never received from) are made,
then --count messages are sent (timing the sends); then a late subscriber
(`late`) joins and must get nothing of them, and --after more messages are
sent, which every live subscription gets.

--mode after-restart: subscribes `excl` again and reports what arrives
within --wait-ms (nothing must: nothing is stored).

--mode partitioned: on a partitioned topic, subscribes (Shared), sends
--count keyed messages and reports what arrived and on which partitions.
"""
import time

import pulsar

import common

p = common.parser(__doc__)
p.add_argument("--mode", choices=["fanout", "after-restart", "partitioned"], required=True)
p.add_argument("--count", type=int, default=200)
p.add_argument("--after", type=int, default=5)
p.add_argument("--wait-ms", type=int, default=1500)
args = p.parse_args()


def drain(consumer, wait_ms):
    """Everything that arrives until nothing has come for wait_ms."""
    got = []
    while True:
        try:
            m = consumer.receive(timeout_millis=wait_ms)
        except pulsar.Timeout:
            return got
        got.append(m.data().decode(errors="replace"))
        consumer.acknowledge(m)


def receive_n(consumers, n, timeout_ms):
    """Round-robins receives over consumers until n messages arrived in all
    (or the deadline passes); returns what each got."""
    got = [[] for _ in consumers]
    deadline = time.monotonic() + timeout_ms / 1000
    while sum(len(g) for g in got) < n and time.monotonic() < deadline:
        for i, c in enumerate(consumers):
            try:
                m = c.receive(timeout_millis=50)
            except pulsar.Timeout:
                continue
            got[i].append(m.data().decode(errors="replace"))
            c.acknowledge(m)
    return got


client = common.client(args)
try:
    if args.mode == "after-restart":
        c = client.subscribe(args.topic, "excl", consumer_type=pulsar.ConsumerType.Exclusive)
        got = drain(c, args.wait_ms)
        common.done({"received": got}, ok=True)

    if args.mode == "partitioned":
        c = client.subscribe(args.topic, "sub", consumer_type=pulsar.ConsumerType.Shared)
        producer = client.create_producer(args.topic, send_timeout_millis=args.timeout_ms,
                                          batching_enabled=False)
        sent = [f"p-{i}" for i in range(args.count)]
        for i, s in enumerate(sent):
            producer.send(s.encode(), partition_key=f"key-{i}")
        got, topics = [], set()
        for _ in range(args.count):
            m = c.receive(timeout_millis=args.timeout_ms)
            got.append(m.data().decode(errors="replace"))
            topics.add(m.topic_name())
            c.acknowledge(m)
        producer.close()
        c.close()
        got.sort(key=lambda s: int(s.split("-")[1]))
        common.done({"received": got, "topics": sorted(topics)}, ok=(got == sent))

    shared = [
        client.subscribe(args.topic, "shared", consumer_type=pulsar.ConsumerType.Shared,
                         consumer_name=f"shared-{i}")
        for i in range(2)
    ]
    excl = client.subscribe(args.topic, "excl", consumer_type=pulsar.ConsumerType.Exclusive)
    slow = client.subscribe(args.topic, "slow", consumer_type=pulsar.ConsumerType.Exclusive,
                            receiver_queue_size=1)
    producer = client.create_producer(args.topic, send_timeout_millis=args.timeout_ms,
                                      batching_enabled=False)
    sent = [f"msg-{i}" for i in range(args.count)]
    ids = []
    started = time.monotonic()
    for s in sent:
        mid = producer.send(s.encode())
        ids.append([mid.ledger_id(), mid.entry_id()])
    send_seconds = time.monotonic() - started

    shared_got = receive_n(shared, args.count, args.timeout_ms)
    excl_got = receive_n([excl], args.count, args.timeout_ms)[0]

    late = client.subscribe(args.topic, "late", consumer_type=pulsar.ConsumerType.Exclusive)
    late_before = drain(late, args.wait_ms)

    after = [f"after-{i}" for i in range(args.after)]
    for s in after:
        producer.send(s.encode())
    late_after = receive_n([late], args.after, args.timeout_ms)[0]
    excl_after = receive_n([excl], args.after, args.timeout_ms)[0]
    slow_got = drain(slow, 500)

    result = {
        "sent": len(sent),
        "send_seconds": send_seconds,
        "receipt_ids": ids[:3],
        "shared_counts": [len(g) for g in shared_got],
        "shared_all": sorted(shared_got[0] + shared_got[1], key=lambda s: int(s.split("-")[1])),
        "excl": excl_got,
        "late_before": late_before,
        "late_after": late_after,
        "excl_after": excl_after,
        "slow_received": len(slow_got),
    }
    for c in shared + [excl, slow, late]:
        c.close()
    producer.close()
    common.done(result, ok=True)
except Exception as e:  # noqa: BLE001
    common.done({"error": f"{type(e).__name__}: {e}"}, ok=False)
finally:
    client.close()
