"""Creates a producer named --name (no batching) and sends `<prefix><id>` with
explicit sequence ids --first..--last (inclusive); prints the producer's
last_sequence_id as the broker announced it and the message ids returned.
Ids must be >= 1: the Python client ignores an explicit sequence_id of 0
(`if sequence_id:`) and assigns the next one itself."""
import common

p = common.parser(__doc__)
p.add_argument("--name", required=True)
p.add_argument("--first", type=int, required=True)
p.add_argument("--last", type=int, required=True)
p.add_argument("--prefix", default="m-")
args = p.parse_args()
if args.first < 1:
    p.error("--first must be >= 1 (an explicit sequence id 0 is ignored by the client)")

client = common.client(args)
try:
    producer = client.create_producer(
        args.topic,
        producer_name=args.name,
        batching_enabled=False,
        send_timeout_millis=args.timeout_ms,
    )
    announced = producer.last_sequence_id()
    ids = []
    for i in range(args.first, args.last + 1):
        mid = producer.send(f"{args.prefix}{i}".encode(), sequence_id=i)
        ids.append([mid.ledger_id(), mid.entry_id()])
    after = producer.last_sequence_id()
    producer.close()
    common.done({"announced_last": announced, "last_after": after, "ids": ids})
except Exception as e:  # noqa: BLE001 - report any client error as a failure
    common.done({"error": f"{type(e).__name__}: {e}"}, ok=False)
finally:
    client.close()
