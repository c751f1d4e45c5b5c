"""Keys and properties round-trip: partition_key, ordering_key, the
properties dict (including non-ASCII text and empty values) and
event_timestamp arrive as sent, for single messages and inside batches; a
message without them arrives without them; publish_timestamp is set."""
import pulsar

import compat_util as u


def sample(i, batched):
    if i == 0:
        return {"content": f"plain-{batched}-0".encode()}
    return {
        "content": f"keyed-{batched}-{i}".encode(),
        "partition_key": f"key-{i % 3}",
        "ordering_key": f"ok-{i}",
        "properties": {"index": str(i), "batched": str(batched), "text": "grüße ✓",
                       "empty": ""},
        "event_timestamp": 1_700_000_000_000 + i,
    }


def main():
    args = u.parse(u.parser(__doc__))
    c = u.Checks()
    client = u.client(args)
    topic = u.topic(args)
    consumer = client.subscribe(topic, "keys", initial_position=pulsar.InitialPosition.Earliest)
    started_ms = u.now_ms()
    expected = []
    for batched in (False, True):
        producer = client.create_producer(
            topic, send_timeout_millis=args.timeout_ms, batching_enabled=batched,
            batching_max_messages=5, batching_max_publish_delay_ms=50)
        samples = [sample(i, batched) for i in range(6)]
        if batched:
            results = []
            for s in samples:
                producer.send_async(callback=lambda res, _id: results.append(res), **s)
            producer.flush()
            c.check("batched sends succeed", all(r == pulsar.Result.Ok for r in results),
                    got=[str(r) for r in results])
        else:
            for s in samples:
                producer.send(**s)
        producer.close()
        expected += samples

    for s in expected:
        m = u.receive_or_none(consumer, args.timeout_ms)
        if not c.check("message arrives", m is not None, expected=s["content"].decode()):
            break
        consumer.acknowledge(m)
        name = s["content"].decode()
        c.equal(f"{name}: content", m.data(), s["content"])
        c.equal(f"{name}: partition_key", m.partition_key(), s.get("partition_key", ""))
        c.equal(f"{name}: ordering_key", m.ordering_key(), s.get("ordering_key", ""))
        c.equal(f"{name}: properties", m.properties(), s.get("properties", {}))
        c.equal(f"{name}: event_timestamp", m.event_timestamp(), s.get("event_timestamp", 0))
        publish = m.publish_timestamp()
        c.check(f"{name}: publish_timestamp is the send time", started_ms - 5000 <= publish
                <= u.now_ms() + 5000, got=publish)
        c.equal(f"{name}: topic_name", m.topic_name(), topic)
    consumer.close()
    u.finish(c, messages=len(expected))


u.run(main)
