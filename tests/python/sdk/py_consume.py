"""SDK interop: the official client subscribes (earliest) and receives
--count messages, acking each; prints payloads, keys and the `i` property."""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import pulsar  # noqa: E402

import common  # noqa: E402

p = common.parser(__doc__)
p.add_argument("--sub", default="py-sub")
p.add_argument("--count", type=int, default=50)
args = p.parse_args()

client = common.client(args)
try:
    consumer = client.subscribe(
        args.topic,
        args.sub,
        consumer_type=pulsar.ConsumerType.Exclusive,
        initial_position=pulsar.InitialPosition.Earliest,
    )
    payloads, keys, props, batch_indexes = [], [], [], []
    for _ in range(args.count):
        m = consumer.receive(timeout_millis=args.timeout_ms)
        payloads.append(m.data().decode(errors="replace"))
        keys.append(m.partition_key())
        props.append(m.properties().get("i"))
        batch_indexes.append(m.message_id().batch_index())
        consumer.acknowledge(m)
    consumer.close()
    common.done({"payloads": payloads, "keys": keys, "props": props,
                 "batch_indexes": batch_indexes})
except Exception as e:  # noqa: BLE001
    common.done({"error": f"{type(e).__name__}: {e}"}, ok=False)
finally:
    client.close()
