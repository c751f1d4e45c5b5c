"""A consume-and-ack run that survives a broker kill -9 (the Rust test kills
and restarts the broker while this runs), recording a history for the Rust
history checker (cms_tests::history).

A producer thread sends --count messages one at a time (each payload a unique
id; a send whose outcome is an error is retried with the same payload, which
the history records as a second invocation); a consumer thread receives,
records, then acks every message, until it has received every payload whose
send was acked and the producer finished, or the deadline passes. Events are
written to --history as JSON lines in the checker's event format; `at_ns` is
the wall clock (time.time_ns), which the Rust side also reads, so it can merge
its own fault events in by time and re-index. The result line reports counts; success means
"the run completed" — the Rust test judges the history."""
import json
import os
import threading
import time

import pulsar

import compat_util as u


class Recorder:
    """Appends checker events (one JSON object a line) under one lock."""

    def __init__(self, path):
        self.file = open(path, "w", buffering=1, encoding="utf-8")
        self.lock = threading.Lock()
        self.index = 0
        self.counts = {}

    def record(self, event, **fields):
        with self.lock:
            line = {"index": self.index, "at_ns": time.time_ns(), "event": event, **fields}
            self.index += 1
            key = event + ":" + str(fields.get("op", ""))
            self.counts[key] = self.counts.get(key, 0) + 1
            self.file.write(json.dumps(line) + "\n")
            self.file.flush()

    def count(self, key):
        with self.lock:
            return self.counts.get(key, 0)


def id_json(message_id):
    ledger, entry, partition, batch = u.mid(message_id)
    return {"ledger_id": ledger, "entry_id": entry, "partition": partition,
            "batch_index": batch}


def main():
    p = u.parser(__doc__)
    p.add_argument("--history", required=True, help="JSON-lines file to write")
    p.add_argument("--count", type=int, default=300)
    p.add_argument("--sub", default="kill-run")
    p.add_argument("--rate", type=float, default=200.0,
                   help="at most this many sends per second (so a kill lands mid-run)")
    p.add_argument("--run-s", type=float, default=60.0,
                   help="stop producing and consuming after this long")
    args = u.parse(p)
    topic = u.topic(args)
    rec = Recorder(args.history)
    client = pulsar.Client(args.url, operation_timeout_seconds=max(1, args.timeout_ms // 1000),
                           connection_timeout_ms=2000)
    consumer = client.subscribe(topic, args.sub, consumer_type=pulsar.ConsumerType.Exclusive,
                                consumer_name="c1",
                                initial_position=pulsar.InitialPosition.Earliest)
    producer = client.create_producer(topic, send_timeout_millis=args.timeout_ms)
    stop_at = time.monotonic() + args.run_s
    acked = set()
    acked_lock = threading.Lock()
    producer_done = threading.Event()
    errors = []

    def produce():
        try:
            started = time.monotonic()
            for i in range(args.count):
                # Pacing: send i is not invoked before i / rate seconds.
                pause = started + i / args.rate - time.monotonic()
                if pause > 0:
                    time.sleep(pause)
                payload = f"k-{i:06d}"
                while time.monotonic() < stop_at:
                    rec.record("send", producer="p1", topic=topic, key=None, payload_id=payload,
                               op="invoked")
                    try:
                        mid = producer.send(payload.encode())
                    except Exception as e:  # noqa: BLE001 - outcome unknown: retry
                        rec.record("send", producer="p1", topic=topic, payload_id=payload,
                                   op="unknown", reason=f"{type(e).__name__}: {e}")
                        time.sleep(0.05)
                        continue
                    rec.record("send", producer="p1", topic=topic, payload_id=payload,
                               op="acked", message_id=id_json(mid))
                    with acked_lock:
                        acked.add(payload)
                    break
        except Exception as e:  # noqa: BLE001
            errors.append(f"producer: {type(e).__name__}: {e}")
        finally:
            producer_done.set()

    received = set()

    def consume():
        try:
            while time.monotonic() < stop_at:
                if producer_done.is_set():
                    with acked_lock:
                        if acked <= received:
                            return
                try:
                    m = consumer.receive(timeout_millis=200)
                except pulsar.Timeout:
                    continue
                except Exception as e:  # noqa: BLE001 - e.g. while reconnecting
                    errors.append(f"receive: {type(e).__name__}: {e}")
                    time.sleep(0.05)
                    continue
                payload = u.text(m)
                mid = id_json(m.message_id())
                rec.record("receive", consumer="c1", subscription=args.sub,
                           sub_type="exclusive", topic=topic, key=None, payload_id=payload,
                           message_id=mid, redelivery_count=m.redelivery_count())
                received.add(payload)
                rec.record("ack", consumer="c1", subscription=args.sub, topic=topic,
                           message_id=mid, payload_id=payload, cumulative=False)
                try:
                    consumer.acknowledge(m)
                except Exception as e:  # noqa: BLE001 - an ack may be lost; history says so
                    errors.append(f"ack: {type(e).__name__}: {e}")
        except Exception as e:  # noqa: BLE001
            errors.append(f"consumer: {type(e).__name__}: {e}")

    threads = [threading.Thread(target=produce), threading.Thread(target=consume)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    with acked_lock:
        missing = sorted(acked - received)
    complete = producer_done.is_set() and len(acked) == args.count and not missing
    try:
        consumer.close()
    except Exception as e:  # noqa: BLE001
        errors.append(f"close: {type(e).__name__}: {e}")
    u.emit({"ok": complete, "acked_sends": len(acked), "received": len(received),
            "missing": missing[:20], "errors": errors[:20], "events": rec.index})
    rec.file.close()
    os._exit(0 if complete else 1)


u.run(main)
