"""Batching with one compression type: a batched, compressed producer; the
consumer receives every message individually, in order, with its content,
and batching really happened (messages share entries, batch indexes set)."""
import pulsar

import compat_util as u

COMPRESSIONS = {
    "NONE": pulsar.CompressionType.NONE,
    "LZ4": pulsar.CompressionType.LZ4,
    "ZLIB": pulsar.CompressionType.ZLib,
    "ZSTD": pulsar.CompressionType.ZSTD,
    "SNAPPY": pulsar.CompressionType.SNAPPY,
}
COUNT = 200


def payload(i):
    # Mixed content: short text, compressible runs, incompressible-ish bytes.
    if i % 10 == 0:
        return (f"run-{i}-" + "abcdefgh" * 2000).encode()
    if i % 10 == 5:
        return bytes((i * 7919 + k * 104729) % 251 for k in range(3000))
    return f"batch-msg-{i}".encode()


def main():
    p = u.parser(__doc__)
    p.add_argument("--compression", required=True, choices=sorted(COMPRESSIONS))
    args = u.parse(p)
    c = u.Checks()
    client = u.client(args)
    topic = u.topic(args)
    consumer = client.subscribe(topic, "batch", initial_position=pulsar.InitialPosition.Earliest)
    producer = client.create_producer(
        topic, send_timeout_millis=args.timeout_ms,
        compression_type=COMPRESSIONS[args.compression], batching_enabled=True,
        batching_max_messages=50, batching_max_publish_delay_ms=20)
    sent = [payload(i) for i in range(COUNT)]
    results = []
    for data in sent:
        producer.send_async(data, lambda res, msg_id: results.append((res, msg_id)))
    producer.flush()
    c.equal("every send succeeded", [str(r) for r, _ in results if r != pulsar.Result.Ok], [])
    producer.close()

    got = []
    ids = []
    for _ in range(COUNT):
        m = u.receive_or_none(consumer, args.timeout_ms)
        if m is None:
            break
        got.append(m.data())
        ids.append(u.mid(m.message_id()))
        consumer.acknowledge(m)
    extra = u.drain_quiet(consumer, 300)
    c.equal("message count", len(got), COUNT)
    mismatched = [i for i, (g, s) in enumerate(zip(got, sent)) if g != s]
    c.equal("every message in order with its content", mismatched, [])
    c.equal("nothing beyond the sent messages", extra, [])
    entries = sorted({(l, e) for l, e, _, _ in ids})
    c.check("messages were batched (fewer entries than messages)", len(entries) < len(ids),
            entries=len(entries), messages=len(ids))
    c.check("batch indexes are set", any(b > 0 for _, _, _, b in ids))
    c.equal("ids strictly increase", ids, sorted(ids))
    consumer.close()
    u.finish(c, compression=args.compression, messages=len(got), entries=len(entries))


u.run(main)
