"""Subscribes first, then produces --count messages and consumes them back, in order."""
import pulsar

import common

p = common.parser(__doc__)
p.add_argument("--count", type=int, default=10)
p.add_argument("--sub", default="sub")
args = p.parse_args()

client = common.client(args)
try:
    consumer = client.subscribe(args.topic, args.sub,
                                initial_position=pulsar.InitialPosition.Earliest)
    producer = client.create_producer(args.topic, send_timeout_millis=args.timeout_ms)
    sent = [f"msg-{i}" for i in range(args.count)]
    for s in sent:
        producer.send(s.encode())
    got = []
    for _ in range(args.count):
        m = consumer.receive(timeout_millis=args.timeout_ms)
        got.append(m.data().decode(errors="replace"))
        consumer.acknowledge(m)
    producer.close()
    consumer.close()
    common.done({"sent": sent, "received": got}, ok=(got == sent))
except Exception as e:  # noqa: BLE001
    common.done({"error": f"{type(e).__name__}: {e}"}, ok=False)
finally:
    client.close()
