"""Failover subscription: only the active consumer receives; when it closes,
the standby takes over and receives the unacked messages (and no acked one),
in order."""
import pulsar

import compat_util as u

COUNT = 20
ACKED = 5


def main():
    args = u.parse(u.parser(__doc__))
    c = u.Checks()
    client = u.client(args)
    topic = u.topic(args)
    consumers = [
        client.subscribe(topic, "failover", consumer_type=pulsar.ConsumerType.Failover,
                         consumer_name=f"failover-{i}")
        for i in range(2)
    ]
    producer = client.create_producer(topic, send_timeout_millis=args.timeout_ms)
    sent = [f"fo-{i}" for i in range(COUNT)]
    for s in sent:
        producer.send(s.encode())

    # Receive everything; note who got it. Ack only the first ACKED messages.
    got = [[], []]
    idle_rounds = 0
    while sum(len(g) for g in got) < COUNT and idle_rounds * 200 < args.timeout_ms:
        progressed = False
        for i, consumer in enumerate(consumers):
            m = u.receive_or_none(consumer, 100)
            if m is not None:
                got[i].append(u.text(m))
                if len(got[0]) + len(got[1]) <= ACKED:
                    consumer.acknowledge(m)
                progressed = True
        idle_rounds = 0 if progressed else idle_rounds + 1
    active = 0 if len(got[0]) >= len(got[1]) else 1
    standby = 1 - active
    c.equal("the active consumer receives every message in order", got[active], sent)
    c.equal("the standby receives nothing while the active is connected", got[standby], [])

    consumers[active].close()
    after = []
    while len(after) < COUNT - ACKED:
        m = u.receive_or_none(consumers[standby], args.timeout_ms)
        if m is None:
            break
        after.append(u.text(m))
        consumers[standby].acknowledge(m)
    after += u.drain_quiet(consumers[standby], 500)
    c.equal("the standby takes over and receives exactly the unacked messages, in order",
            after, sent[ACKED:])
    consumers[standby].close()
    u.finish(c, active=active, counts=[len(got[0]), len(got[1])], after_failover=len(after))


u.run(main)
