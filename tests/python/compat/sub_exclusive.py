"""Exclusive subscription: a second consumer is refused with ConsumerBusy and
the first keeps receiving every message, in order."""
import pulsar

import compat_util as u


def main():
    args = u.parse(u.parser(__doc__))
    c = u.Checks()
    client = u.client(args)
    topic = u.topic(args)
    first = client.subscribe(topic, "excl", consumer_type=pulsar.ConsumerType.Exclusive,
                             initial_position=pulsar.InitialPosition.Earliest)
    second_error = None
    try:
        client.subscribe(topic, "excl", consumer_type=pulsar.ConsumerType.Exclusive)
    except pulsar.ConsumerBusy as e:
        second_error = f"ConsumerBusy: {e}"
    except Exception as e:  # noqa: BLE001
        second_error = f"{type(e).__name__}: {e}"
    c.check("second consumer refused with ConsumerBusy",
            second_error is not None and second_error.startswith("ConsumerBusy"),
            got=second_error)

    producer = client.create_producer(topic, send_timeout_millis=args.timeout_ms)
    sent = [f"excl-{i}" for i in range(10)]
    for s in sent:
        producer.send(s.encode())
    got = []
    for _ in sent:
        m = u.receive_or_none(first, args.timeout_ms)
        if m is None:
            break
        got.append(u.text(m))
        first.acknowledge(m)
    c.equal("first consumer receives every message in order", got, sent)
    # A different subscription on the same topic is not affected by the exclusive one.
    other = client.subscribe(topic, "excl-other", consumer_type=pulsar.ConsumerType.Exclusive,
                             initial_position=pulsar.InitialPosition.Earliest)
    m = u.receive_or_none(other, args.timeout_ms)
    c.equal("another subscription of the topic works", m and u.text(m), sent[0])
    first.close()
    # Once the exclusive consumer left, a new one is accepted.
    try:
        again = client.subscribe(topic, "excl", consumer_type=pulsar.ConsumerType.Exclusive)
        again.close()
        c.check("a new consumer is accepted after the first closed", True)
    except Exception as e:  # noqa: BLE001
        c.check("a new consumer is accepted after the first closed", False,
                got=f"{type(e).__name__}: {e}")
    u.finish(c, second_consumer=second_error, received=len(got))


u.run(main)
