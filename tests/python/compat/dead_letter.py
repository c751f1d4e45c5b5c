"""The client's dead-letter policy: a message negatively acked on every
delivery is delivered max_redeliver_count + 1 times (redelivery counts
0..max), then the client moves it to the dead-letter topic, with its content
and properties, and it is not delivered on the subscription again; other
messages are unaffected."""
import pulsar

import compat_util as u

MAX_REDELIVER = 2


def main():
    args = u.parse(u.parser(__doc__))
    c = u.Checks()
    client = u.client(args)
    topic = u.topic(args)
    dlq_topic = u.topic(args, "-dlq")
    dlq = client.subscribe(dlq_topic, "dlq-reader",
                           initial_position=pulsar.InitialPosition.Earliest)
    consumer = client.subscribe(
        topic, "dl", consumer_type=pulsar.ConsumerType.Shared,
        initial_position=pulsar.InitialPosition.Earliest,
        negative_ack_redelivery_delay_ms=100,
        dead_letter_policy=pulsar.ConsumerDeadLetterPolicy(
            max_redeliver_count=MAX_REDELIVER, dead_letter_topic=dlq_topic))
    producer = client.create_producer(topic, send_timeout_millis=args.timeout_ms)
    producer.send(b"poison", properties={"kind": "poison"})
    producer.send(b"good-0")
    producer.send(b"good-1")

    poison_counts = []
    good = []
    while True:
        m = u.receive_or_none(consumer, 1500)
        if m is None:
            break
        if u.text(m) == "poison":
            poison_counts.append(m.redelivery_count())
            consumer.negative_acknowledge(m)
        else:
            good.append(u.text(m))
            consumer.acknowledge(m)
    c.equal("the poison message is delivered with counts 0..max", poison_counts,
            list(range(MAX_REDELIVER + 1)))
    c.equal("other messages are delivered once", good, ["good-0", "good-1"])

    m = u.receive_or_none(dlq, args.timeout_ms)
    c.check("the poison message lands on the dead-letter topic", m is not None)
    dlq_props = {}
    if m is not None:
        dlq_props = m.properties()
        c.equal("dead-letter content", m.data(), b"poison")
        c.equal("dead-letter keeps the original properties", dlq_props.get("kind"), "poison")
        c.check("dead-letter names the original topic", "REAL_TOPIC" in dlq_props,
                got=dlq_props)
        dlq.acknowledge(m)
    c.equal("only the poison message is dead-lettered", u.drain_quiet(dlq, 500), [])
    consumer.close()
    dlq.close()
    u.finish(c, poison_counts=poison_counts, dlq_properties=dlq_props)


u.run(main)
