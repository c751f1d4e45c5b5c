"""Chunked messages: a producer with ``chunking_enabled=True`` (batching off)
splits a message larger than the broker's max message size into chunks; the
broker stores and dispatches them as ordinary entries and the consumer
reassembles the message intact. Small messages around it are unaffected.
Checked on an Exclusive subscription and on a reader from earliest, and
after a resubscribe without acks (the chunks are redelivered)."""
import os

import pulsar

import compat_util as u


def main():
    p = u.parser(__doc__)
    p.add_argument("--max-bytes", type=int, required=True,
                   help="the broker's max message size")
    args = u.parse(p)
    c = u.Checks()
    client = u.client(args)
    topic = u.topic(args)
    consumer = client.subscribe(topic, "chunked",
                                initial_position=pulsar.InitialPosition.Earliest)
    producer = client.create_producer(topic, send_timeout_millis=args.timeout_ms,
                                      batching_enabled=False, chunking_enabled=True)
    big = os.urandom(args.max_bytes * 2 + 12345)
    bigger = os.urandom(args.max_bytes * 3 + 1)
    sent = [b"small-0", big, b"small-1", bigger, b"small-2"]
    for data in sent:
        producer.send(data)
    want = [u.digest(d) for d in sent]

    def receive_all(cons, ack):
        got = []
        for _ in range(len(sent)):
            m = u.receive_or_none(cons, args.timeout_ms)
            if m is None:
                break
            got.append(u.digest(m.data()))
            if ack:
                cons.acknowledge(m)
        return got

    c.equal("consumer: every message, big ones reassembled, in order",
            receive_all(consumer, False), want)
    consumer.close()
    again = client.subscribe(topic, "chunked",
                             initial_position=pulsar.InitialPosition.Earliest)
    c.equal("resubscribe without acks: everything again, reassembled",
            receive_all(again, True), want)
    again.close()

    reader = client.create_reader(topic, pulsar.MessageId.earliest)
    got = []
    for _ in range(len(sent)):
        m = u.read_or_none(reader, args.timeout_ms)
        if m is None:
            break
        got.append(u.digest(m.data()))
    c.equal("reader from earliest: every message, reassembled", got, want)
    reader.close()
    u.finish(c)


u.run(main)
