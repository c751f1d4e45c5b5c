"""SDK interop: the official client produces --count messages `py-<i>-<pad>`
with key `k<i>` and property i=<i>, optionally batched and compressed."""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import pulsar  # noqa: E402

import common  # noqa: E402

COMPRESSIONS = {
    "NONE": pulsar.CompressionType.NONE,
    "LZ4": pulsar.CompressionType.LZ4,
    "ZLIB": pulsar.CompressionType.ZLib,
    "ZSTD": pulsar.CompressionType.ZSTD,
    "SNAPPY": pulsar.CompressionType.SNAPPY,
}

p = common.parser(__doc__)
p.add_argument("--count", type=int, default=50)
p.add_argument("--compression", default="NONE", choices=sorted(COMPRESSIONS))
p.add_argument("--batching", action="store_true")
args = p.parse_args()

client = common.client(args)
try:
    producer = client.create_producer(
        args.topic,
        batching_enabled=args.batching,
        batching_max_publish_delay_ms=50,
        compression_type=COMPRESSIONS[args.compression],
        send_timeout_millis=args.timeout_ms,
    )
    for i in range(args.count):
        producer.send_async(
            (f"py-{i}-" + "abc" * (i * 37 % 400)).encode(),
            None,
            partition_key=f"k{i}",
            properties={"i": str(i)},
        )
    producer.flush()
    producer.close()
    common.done({"sent": args.count})
except Exception as e:  # noqa: BLE001 - report any client error as a failure
    common.done({"error": f"{type(e).__name__}: {e}"}, ok=False)
finally:
    client.close()
