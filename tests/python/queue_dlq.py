"""Consumes a queue the way its admin settings say (GET /admin/v2/queues/...):
Shared on the queue's subscription with a dead-letter policy of
--max-redeliveries to --dlq; negatively acknowledges every delivery of
--count messages until they reach the DLQ, then reads them from the DLQ.
With --backlog-url (the queue's admin stats), it then waits, bounded by
--timeout-ms, until the queue's msgBacklog is 0 before it closes the client.
Prints {"dead": [payloads read from the DLQ], "deliveries": n,
"backlog": the last msgBacklog read (null without --backlog-url)}."""
import json
import time
import urllib.request

import pulsar

import common

p = common.parser(__doc__)
p.add_argument("--sub", default="queue")
p.add_argument("--dlq", required=True)
p.add_argument("--max-redeliveries", type=int, required=True)
p.add_argument("--count", type=int, default=2)
p.add_argument("--backlog-url", help="GET URL of the queue's stats (JSON with msgBacklog)")
args = p.parse_args()

client = common.client(args)
keep_open = []
try:
    dl = client.subscribe(args.dlq, "dlq-reader",
                          initial_position=pulsar.InitialPosition.Earliest)
    cons = client.subscribe(
        args.topic, args.sub,
        consumer_type=pulsar.ConsumerType.Shared,
        initial_position=pulsar.InitialPosition.Earliest,
        negative_ack_redelivery_delay_ms=100,
        dead_letter_policy=pulsar.ConsumerDeadLetterPolicy(
            max_redeliver_count=args.max_redeliveries, dead_letter_topic=args.dlq))
    deliveries = 0
    # Each message is delivered 1 + max_redeliveries times, then goes to the DLQ.
    for _ in range(args.count * (args.max_redeliveries + 1)):
        m = cons.receive(args.timeout_ms)
        deliveries += 1
        cons.negative_acknowledge(m)
    dead = []
    for _ in range(args.count):
        d = dl.receive(args.timeout_ms)
        dl.acknowledge(d)
        dead.append(d.data().decode(errors="replace"))
    # Not closed before client.close(): pulsar-client-cpp acks the original
    # message from the DLQ producer's send callback and crashes (SIGSEGV) if
    # the consumer or the client is being closed at that moment (see
    # features.py). The dead letter can be read back before that callback has
    # run, so with --backlog-url this waits for the broker to have the acks
    # (the backlog reaches 0) before anything is closed.
    keep_open.extend([cons, dl])
    backlog = None
    if args.backlog_url:
        deadline = time.monotonic() + args.timeout_ms / 1000
        while True:
            with urllib.request.urlopen(args.backlog_url, timeout=5) as r:
                backlog = json.load(r).get("msgBacklog")
            if backlog == 0 or time.monotonic() >= deadline:
                break
            time.sleep(0.05)
    common.done({"dead": sorted(dead), "deliveries": deliveries, "backlog": backlog})
except Exception as e:  # noqa: BLE001
    common.done({"error": f"{type(e).__name__}: {e}"}, ok=False)
finally:
    client.close()
