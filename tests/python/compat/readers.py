"""Readers: a reader from MessageId.earliest reads everything; a reader from
a stored (serialized) message id starts right after it, or at it with
start_message_id_inclusive; a reader from MessageId.latest sees only new
messages; has_message_available (GET_LAST_MESSAGE_ID) tells the truth before
and after."""
import pulsar

import compat_util as u

COUNT = 10


def read_n(reader, n, timeout_ms):
    out = []
    for _ in range(n):
        m = u.read_or_none(reader, timeout_ms)
        if m is None:
            break
        out.append(u.text(m))
    return out


def main():
    args = u.parse(u.parser(__doc__))
    c = u.Checks()
    client = u.client(args)
    topic = u.topic(args)
    producer = client.create_producer(topic, send_timeout_millis=args.timeout_ms)
    sent = [f"r-{i}" for i in range(COUNT)]
    ids = [producer.send(s.encode()) for s in sent]
    stored = [i.serialize() for i in ids]

    # From the earliest message.
    reader = client.create_reader(topic, pulsar.MessageId.earliest)
    c.equal("earliest reader: has_message_available before reading",
            reader.has_message_available(), True)
    got = read_n(reader, COUNT, args.timeout_ms)
    c.equal("earliest reader reads everything in order", got, sent)
    c.equal("earliest reader: has_message_available after reading everything",
            reader.has_message_available(), False)

    # From a stored id, exclusive (the default) and inclusive.
    start = pulsar.MessageId.deserialize(stored[4])
    c.equal("a deserialized id equals the original", u.mid(start), u.mid(ids[4]))
    after = client.create_reader(topic, start)
    c.equal("reader from a stored id starts after it",
            read_n(after, COUNT - 5, args.timeout_ms), sent[5:])
    c.equal("reader from a stored id: nothing left", after.has_message_available(), False)
    inclusive = client.create_reader(topic, pulsar.MessageId.deserialize(stored[4]),
                                     start_message_id_inclusive=True)
    c.equal("inclusive reader from a stored id starts at it",
            read_n(inclusive, COUNT - 4, args.timeout_ms), sent[4:])

    # From the latest position: only messages sent afterwards.
    latest = client.create_reader(topic, pulsar.MessageId.latest)
    c.equal("latest reader: nothing available yet", latest.has_message_available(), False)
    producer.send(b"r-new")
    c.equal("latest reader: the new message is available", latest.has_message_available(), True)
    c.equal("latest reader reads only the new message", read_n(latest, 1, args.timeout_ms),
            ["r-new"])
    # The earliest reader sees it too, after it had read everything.
    c.equal("earliest reader tails the new message", read_n(reader, 1, args.timeout_ms),
            ["r-new"])

    for r in (reader, after, inclusive, latest):
        r.close()
    u.finish(c)


u.run(main)
