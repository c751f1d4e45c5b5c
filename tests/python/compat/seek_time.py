"""Seek by publish time: ``consumer.seek(timestamp_ms)`` on a durable
subscription and ``reader.seek(timestamp_ms)`` on a reader move to the first
message published at or after that time, so exactly the later messages are
delivered again; a seek to a time before the first message delivers
everything, one after the last delivers nothing old (only what is sent
after it)."""
import time

import pulsar

import compat_util as u

FIRST = 5
SECOND = 5


def now_ms():
    return int(time.time() * 1000)


def collect(receive, ack, n, timeout_ms):
    got = []
    for _ in range(n):
        m = receive(timeout_ms)
        if m is None:
            break
        got.append(u.text(m))
        if ack:
            ack(m)
    return got


def main():
    args = u.parse(u.parser(__doc__))
    c = u.Checks()
    client = u.client(args)
    topic = u.topic(args)
    consumer = client.subscribe(topic, "seek-time",
                                initial_position=pulsar.InitialPosition.Earliest)
    producer = client.create_producer(topic, send_timeout_millis=args.timeout_ms,
                                      batching_enabled=False)
    before_all = now_ms() - 1
    first = [f"early-{i}" for i in range(FIRST)]
    second = [f"late-{i}" for i in range(SECOND)]
    for s in first:
        producer.send(s.encode())
    # Publish times are the broker's wall clock in ms: leave a gap.
    time.sleep(0.2)
    split = now_ms()
    time.sleep(0.2)
    for s in second:
        producer.send(s.encode())
    time.sleep(0.2)
    after_all = now_ms()

    everything = first + second
    recv = lambda t: u.receive_or_none(consumer, t)  # noqa: E731
    got = collect(recv, consumer.acknowledge, len(everything), args.timeout_ms)
    c.equal("consumer: everything arrives", got, everything)

    consumer.seek(split)
    got = collect(recv, consumer.acknowledge, SECOND, args.timeout_ms)
    got += u.drain_quiet(consumer, 500)
    c.equal("consumer: seek(split time) delivers exactly the later messages", got, second)

    consumer.seek(before_all)
    got = collect(recv, consumer.acknowledge, len(everything), args.timeout_ms)
    got += u.drain_quiet(consumer, 500)
    c.equal("consumer: seek(before the first) delivers everything", got, everything)

    consumer.seek(after_all)
    got = u.drain_quiet(consumer, 500)
    c.equal("consumer: seek(after the last) delivers nothing old", got, [])
    producer.send(b"new")
    got = collect(recv, consumer.acknowledge, 1, args.timeout_ms)
    c.equal("consumer: after seek(after the last) new messages still arrive", got, ["new"])
    consumer.close()

    reader = client.create_reader(topic, pulsar.MessageId.earliest)
    rread = lambda t: u.read_or_none(reader, t)  # noqa: E731
    got = collect(rread, None, len(everything) + 1, args.timeout_ms)
    c.equal("reader: everything from earliest", got, everything + ["new"])
    reader.seek(split)
    got = collect(rread, None, SECOND + 1, args.timeout_ms)
    c.equal("reader: seek(split time) reads the later messages again", got, second + ["new"])
    c.check("reader: nothing more after them", u.read_or_none(reader, 500) is None)
    reader.close()

    # A reader created at latest and moved back by time (the Python client
    # has no start-by-time option: a seek right after creation is the way).
    late_reader = client.create_reader(topic, pulsar.MessageId.latest)
    late_reader.seek(split)
    got = collect(lambda t: u.read_or_none(late_reader, t), None, SECOND + 1, args.timeout_ms)
    c.equal("reader at latest then seek(split time): the later messages", got, second + ["new"])
    late_reader.close()
    u.finish(c)


u.run(main)
