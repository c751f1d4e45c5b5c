"""W1: synchronous publish latency. One producer sends --count messages of
--size bytes one at a time (each send waits for its receipt); prints the
latency percentiles (milliseconds, from every sample) and the rate."""
import time

import common

p = common.parser(__doc__)
p.add_argument("--count", type=int, default=10000)
p.add_argument("--size", type=int, default=1024)
p.add_argument("--warmup", type=int, default=200)
args = p.parse_args()

client = common.client(args)
try:
    producer = client.create_producer(args.topic, batching_enabled=False,
                                      send_timeout_millis=args.timeout_ms)
    payload = b"x" * args.size
    for _ in range(args.warmup):
        producer.send(payload)
    samples = []
    start = time.perf_counter()
    for _ in range(args.count):
        t = time.perf_counter()
        producer.send(payload)
        samples.append((time.perf_counter() - t) * 1000.0)
    elapsed = time.perf_counter() - start
    producer.close()
    samples.sort()

    def pct(q):
        return round(samples[min(len(samples) - 1, int(q * len(samples)))], 3)

    common.done({
        "workload": "W1 sync publish", "count": args.count, "size": args.size,
        "p50_ms": pct(0.50), "p99_ms": pct(0.99), "p999_ms": pct(0.999),
        "max_ms": round(samples[-1], 3), "msgs_per_s": round(args.count / elapsed, 1),
    })
except Exception as e:  # noqa: BLE001
    common.done({"error": f"{type(e).__name__}: {e}"}, ok=False)
finally:
    client.close()
