"""Produces --count messages (sync, one at a time, --interval-ms apart) while a
consumer receives and acks them, both riding through broker restarts (the test
kills and restarts the broker meanwhile). Prints which sends were
acknowledged, which failed, and every received payload (duplicates included),
so the caller can check: every acknowledged send received, nothing
unexpected received."""
import threading
import time

import pulsar

import common

p = common.parser(__doc__)
p.add_argument("--count", type=int, default=500)
p.add_argument("--interval-ms", type=int, default=10)
p.add_argument("--deadline-s", type=float, default=40.0)
p.add_argument("--sub", default="through-restart")
args = p.parse_args()

client = pulsar.Client(args.url, operation_timeout_seconds=30)
acked, failed, received = [], [], []
lock = threading.Lock()
producer_done = threading.Event()
deadline = time.time() + args.deadline_s


def produce():
    producer = client.create_producer(args.topic, send_timeout_millis=30000,
                                      batching_enabled=False)
    for i in range(args.count):
        payload = f"m-{i}"
        try:
            producer.send(payload.encode())
            with lock:
                acked.append(payload)
        except Exception:  # noqa: BLE001 - outcome unknown: may or may not be stored
            with lock:
                failed.append(payload)
        print(f"progress {i}", flush=True)
        time.sleep(args.interval_ms / 1000.0)
    producer_done.set()


try:
    consumer = client.subscribe(args.topic, args.sub,
                                initial_position=pulsar.InitialPosition.Earliest)
    t = threading.Thread(target=produce, daemon=True)
    t.start()
    while time.time() < deadline:
        try:
            m = consumer.receive(timeout_millis=500)
        except pulsar.Timeout:
            with lock:
                seen = set(received)
                if producer_done.is_set() and all(a in seen for a in acked):
                    break
            continue
        with lock:
            received.append(m.data().decode(errors="replace"))
        consumer.acknowledge(m)
    common.done({"acked": acked, "failed": failed, "received": received,
                 "producer_done": producer_done.is_set()})
except Exception as e:  # noqa: BLE001
    common.done({"error": f"{type(e).__name__}: {e}"}, ok=False)
finally:
    client.close()
