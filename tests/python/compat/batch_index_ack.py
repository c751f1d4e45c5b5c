"""Batch-index acknowledgement (``batch_index_ack_enabled=True``): in a batch
of 10 messages, acking 4 of them individually acknowledges just those; after
close + resubscribe exactly the 6 unacked come back (the broker sends the
batch with its ack set, the client skips the acked ones). Acking those 6
completes the entry: nothing comes back after that.

``--phase all`` runs it in one go; ``--phase first`` stops after the 4 acks
and ``--phase rest`` (e.g. after a broker restart: the cursor persists the
batch's acked indexes) checks the 6 and completes."""
import time

import pulsar

import compat_util as u

COUNT = 10
ACKED = [0, 2, 5, 7]
SUB = "batch-index"


def subscribe(client, topic):
    return client.subscribe(topic, SUB, consumer_type=pulsar.ConsumerType.Shared,
                            initial_position=pulsar.InitialPosition.Earliest,
                            batch_index_ack_enabled=True)


def receive_n(consumer, n, timeout_ms):
    got = []
    for _ in range(n):
        m = u.receive_or_none(consumer, timeout_ms)
        if m is None:
            break
        got.append(m)
    return got


def first(c, client, args, topic):
    consumer = subscribe(client, topic)
    producer = client.create_producer(topic, send_timeout_millis=args.timeout_ms,
                                      batching_enabled=True,
                                      batching_max_messages=COUNT,
                                      batching_max_publish_delay_ms=60000)
    sent = [f"m-{i}" for i in range(COUNT)]
    for s in sent:
        producer.send_async(s.encode(), None)
    producer.flush()
    got = receive_n(consumer, COUNT, args.timeout_ms)
    c.equal("all 10 arrive", [u.text(m) for m in got], sent)
    c.equal("they are one batch (one entry, batch indexes 0..9)",
            sorted({(m.message_id().ledger_id(), m.message_id().entry_id()) for m in got}).__len__(),
            1)
    for m in got:
        if int(u.text(m).split("-")[1]) in ACKED:
            consumer.acknowledge(m)
    # The client groups acks for up to 100 ms; close sends what is pending.
    time.sleep(0.3)
    consumer.close()


def rest(c, client, args, topic):
    consumer = subscribe(client, topic)
    want = [f"m-{i}" for i in range(COUNT) if i not in ACKED]
    got = receive_n(consumer, len(want), args.timeout_ms)
    texts = [u.text(m) for m in got]
    extra = u.drain_quiet(consumer, 1000)
    c.equal("after resubscribe exactly the 6 unacked come back", texts, want)
    c.equal("nothing else comes back", extra, [])
    for m in got:
        consumer.acknowledge(m)
    time.sleep(0.3)
    consumer.close()
    again = subscribe(client, topic)
    c.equal("once all 10 are acked the entry is acked: nothing comes back",
            u.drain_quiet(again, 1000), [])
    again.close()


def main():
    p = u.parser(__doc__)
    p.add_argument("--phase", choices=["all", "first", "rest"], default="all")
    args = u.parse(p)
    c = u.Checks()
    client = u.client(args)
    topic = u.topic(args)
    if args.phase in ("all", "first"):
        first(c, client, args, topic)
    if args.phase in ("all", "rest"):
        rest(c, client, args, topic)
    u.finish(c)


u.run(main)
