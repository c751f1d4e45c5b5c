"""Subscribes (--sub, --sub-type, earliest) and receives --count messages, acking each; prints payloads."""
import pulsar

import common

p = common.parser(__doc__)
p.add_argument("--sub", default="sub")
p.add_argument("--sub-type", default="Exclusive",
               choices=["Exclusive", "Shared", "Failover"])
p.add_argument("--count", type=int, default=10)
p.add_argument("--no-ack", action="store_true")
p.add_argument("--drain", action="store_true",
               help="receive until a receive times out (at most --count messages)")
args = p.parse_args()

client = common.client(args)
try:
    consumer = client.subscribe(
        args.topic,
        args.sub,
        consumer_type=getattr(pulsar.ConsumerType, args.sub_type),
        initial_position=pulsar.InitialPosition.Earliest,
    )
    payloads = []
    redeliveries = []
    for _ in range(args.count):
        try:
            m = consumer.receive(timeout_millis=args.timeout_ms)
        except pulsar.Timeout:
            if args.drain:
                break
            raise
        payloads.append(m.data().decode(errors="replace"))
        redeliveries.append(m.redelivery_count())
        if not args.no_ack:
            consumer.acknowledge(m)
    consumer.close()
    common.done({"received": payloads, "redelivery_counts": redeliveries})
except Exception as e:  # noqa: BLE001
    common.done({"error": f"{type(e).__name__}: {e}"}, ok=False)
finally:
    client.close()
