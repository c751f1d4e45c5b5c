"""consumer.seek(msg_id) on a durable subscription rewinds it: the messages
after that id are delivered again. The C++ client (4.2) drops the message at
the seek id itself (it becomes the exclusive start id), so after seek(id of
message 3) the consumer receives messages 4.. again.

Two cases: (a) seek after receiving without acking; (b) seek right after
acking everything, while the client's acks are still in its 100 ms grouping
window. In (b) the client sends those acks after SEEK succeeds; Apache Pulsar
disconnects the subscription's consumers on seek, so those late acks are
dropped with the old consumer and the rewind holds. Either way, every message
after the seek id must come again."""
import pulsar

import compat_util as u

COUNT = 10


def run_case(c, client, args, topic, sub, ack_before_seek, ids, sent):
    consumer = client.subscribe(topic, sub, initial_position=pulsar.InitialPosition.Earliest)
    first = []
    for _ in range(COUNT):
        m = u.receive_or_none(consumer, args.timeout_ms)
        if m is None:
            break
        first.append(u.text(m))
        if ack_before_seek:
            consumer.acknowledge(m)
    c.equal(f"{sub}: everything arrives before the seek", first, sent)
    consumer.seek(ids[3])
    again = []
    while len(again) < COUNT - 4:
        m = u.receive_or_none(consumer, args.timeout_ms)
        if m is None:
            break
        again.append(u.text(m))
        consumer.acknowledge(m)
    again += u.drain_quiet(consumer, 500)
    c.equal(f"{sub}: after seek(id of message 3) messages 4.. arrive again", again, sent[4:])
    consumer.close()


def main():
    args = u.parse(u.parser(__doc__))
    c = u.Checks()
    client = u.client(args)
    topic = u.topic(args)
    producer = client.create_producer(topic, send_timeout_millis=args.timeout_ms)
    sent = [f"s-{i}" for i in range(COUNT)]
    ids = [producer.send(s.encode()) for s in sent]
    run_case(c, client, args, topic, "seek-unacked", False, ids, sent)
    run_case(c, client, args, topic, "seek-after-acks", True, ids, sent)
    u.finish(c)


u.run(main)
