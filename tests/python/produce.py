"""Sends --count messages `<prefix><i>` synchronously; prints their message ids."""
import common

p = common.parser(__doc__)
p.add_argument("--count", type=int, default=10)
p.add_argument("--prefix", default="msg-")
p.add_argument("--batching", action="store_true")
args = p.parse_args()

client = common.client(args)
try:
    producer = client.create_producer(
        args.topic,
        batching_enabled=args.batching,
        send_timeout_millis=args.timeout_ms,
    )
    ids = []
    for i in range(args.count):
        ids.append(str(producer.send(f"{args.prefix}{i}".encode())))
    producer.flush()
    name = producer.producer_name()
    producer.close()
    common.done({"sent": args.count, "ids": ids, "producer_name": name})
except Exception as e:  # noqa: BLE001 - report any client error as a failure
    common.done({"error": f"{type(e).__name__}: {e}"}, ok=False)
finally:
    client.close()
