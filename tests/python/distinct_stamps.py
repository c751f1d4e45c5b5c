"""Reads a topic from the earliest message on a subscription until a receive
times out (at most --max messages) and counts the distinct 8-byte send stamps
that `cms-perf end-to-end` puts at the start of every payload: the benchmark
suite's W6 loss check (messages read back vs. sends acknowledged; the distinct
stamps are informative only: sends that catch up after a stall may share a
microsecond stamp)."""
import pulsar

import common

p = common.parser(__doc__)
p.add_argument("--sub", default="distinct-stamps")
p.add_argument("--max", type=int, default=10_000_000)
p.add_argument("--subscribe-only", action="store_true",
               help="create the durable subscription and exit: run before publishing, "
                    "so it holds every message (acknowledged ledgers are trimmed otherwise)")
args = p.parse_args()

client = common.client(args)
try:
    consumer = client.subscribe(
        args.topic,
        args.sub,
        initial_position=pulsar.InitialPosition.Earliest,
    )
    if args.subscribe_only:
        consumer.close()
        common.done({"subscribed": args.sub})
    stamps = set()
    received = 0
    while received < args.max:
        try:
            m = consumer.receive(timeout_millis=args.timeout_ms)
        except pulsar.Timeout:
            break
        received += 1
        stamps.add(bytes(m.data()[:8]))
        consumer.acknowledge(m)
    consumer.close()
    common.done({"received": received, "distinct": len(stamps)})
except Exception as e:  # noqa: BLE001
    common.done({"error": f"{type(e).__name__}: {e}"}, ok=False)
