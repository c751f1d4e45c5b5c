"""Quota checks with the official client against one broker.

Modes:
  rate      publish --count messages of --size bytes with send_async as fast
            as the client lets it; prints {"acked", "errors", "seconds"}.
  producers create producers on --topic until one is refused (at most
            --count); prints {"created", "error"}.
  create    create one producer on --topic; prints {"created", "error"}.
  backlog   subscribe (--sub, no acks), publish --count messages of --size
            bytes, then print {"acked", "errors"}.
  hold      subscribe (--sub) on a second client, publish --count messages
            of --size bytes with send_async, --interval-ms apart; after
            3 s (at least) record how many were
            acknowledged ("held_at"), then drain the subscription with acks
            and wait for every send; prints {"held_at", "acked", "errors",
            "received"}.
  age_hold  subscribe (--sub) on a second client, publish one message, wait
            --age-wait-s (past a message_age quota), then publish --count
            messages with send_async; after 3 s record how many were
            acknowledged ("held_at"), then drain the subscription with acks
            and wait for every send; prints {"held_at", "acked", "errors",
            "received"} (received counts the first message too).
"""
import time

import pulsar

import common

p = common.parser(__doc__)
p.add_argument("--mode", required=True)
p.add_argument("--count", type=int, default=100)
p.add_argument("--size", type=int, default=100)
p.add_argument("--sub", default="quota-sub")
p.add_argument("--interval-ms", type=int, default=10,
               help="hold: pause between sends")
p.add_argument("--age-wait-s", type=float, default=4.0,
               help="age_hold: wait after the first message")
args = p.parse_args()
c = common.client(args)


def err(e):
    return f"{type(e).__name__}: {e}"


if args.mode == "rate":
    prod = c.create_producer(args.topic, batching_enabled=False,
                             max_pending_messages=100, block_if_queue_full=True,
                             send_timeout_millis=60000)
    acked = []
    errors = []

    def cb(res, _mid):
        if res == pulsar.Result.Ok:
            acked.append(1)
        else:
            errors.append(str(res))

    t0 = time.time()
    for i in range(args.count):
        prod.send_async(b"x" * args.size, cb)
    prod.flush()
    seconds = time.time() - t0
    # Closed before exit: the C++ client may abort when torn down at exit.
    prod.close()
    c.close()
    common.done({"acked": len(acked), "errors": errors, "seconds": seconds})
elif args.mode == "producers":
    made = []
    error = None
    for i in range(args.count):
        try:
            made.append(c.create_producer(args.topic))
        except Exception as e:  # noqa: BLE001
            error = err(e)
            break
    for m in made:
        m.close()
    c.close()
    common.done({"created": len(made), "error": error})
elif args.mode == "create":
    try:
        c.create_producer(args.topic).close()
        result = {"created": 1, "error": None}
    except Exception as e:  # noqa: BLE001
        result = {"created": 0, "error": err(e)}
    c.close()
    common.done(result)
elif args.mode == "backlog":
    c.subscribe(args.topic, args.sub)
    prod = c.create_producer(args.topic, batching_enabled=False)
    acked = 0
    errors = []
    for i in range(args.count):
        try:
            prod.send(b"y" * args.size)
            acked += 1
        except Exception as e:  # noqa: BLE001
            errors.append(err(e))
            break
    c.close()
    common.done({"acked": acked, "errors": errors})
elif args.mode == "hold":
    c2 = common.client(args)
    cons = c2.subscribe(args.topic, args.sub)
    prod = c.create_producer(args.topic, batching_enabled=False,
                             max_pending_messages=args.count,
                             send_timeout_millis=60000)
    acked = []
    errors = []

    def cb(res, _mid):
        if res == pulsar.Result.Ok:
            acked.append(1)
        else:
            errors.append(str(res))

    t0 = time.time()
    for i in range(args.count):
        prod.send_async(b"h" * args.size, cb)
        time.sleep(args.interval_ms / 1000)
    time.sleep(max(0.0, 3 - (time.time() - t0)))
    held_at = len(acked)
    received = 0
    deadline = time.time() + 30
    while (len(acked) + len(errors) < args.count or received < args.count) \
            and time.time() < deadline:
        try:
            m = cons.receive(timeout_millis=500)
            cons.acknowledge(m)
            received += 1
        except pulsar.Timeout:
            pass
    c.close()
    c2.close()
    common.done({"held_at": held_at, "acked": len(acked), "errors": errors,
                 "received": received})
elif args.mode == "age_hold":
    c2 = common.client(args)
    cons = c2.subscribe(args.topic, args.sub)
    prod = c.create_producer(args.topic, batching_enabled=False,
                             max_pending_messages=args.count + 1,
                             send_timeout_millis=60000)
    prod.send(b"first")
    time.sleep(args.age_wait_s)
    acked = []
    errors = []

    def cb(res, _mid):
        if res == pulsar.Result.Ok:
            acked.append(1)
        else:
            errors.append(str(res))

    for i in range(args.count):
        prod.send_async(b"a" * args.size, cb)
    time.sleep(3)
    held_at = len(acked)
    received = 0
    deadline = time.time() + 30
    while (len(acked) + len(errors) < args.count
           or received < args.count + 1) and time.time() < deadline:
        try:
            m = cons.receive(timeout_millis=500)
            cons.acknowledge(m)
            received += 1
        except pulsar.Timeout:
            pass
    c.close()
    c2.close()
    common.done({"held_at": held_at, "acked": len(acked), "errors": errors,
                 "received": received})
else:
    raise SystemExit(f"unknown mode {args.mode}")
