"""Clients for the ownership tests (tests/tests/broker_ownership.rs).

`produce`: one producer per topic, synchronous sends round-robin over the
topics (`<tag>-<i>`), one stdout line per outcome: `ACK <topic> <payload>
<unix ms>` or `ERR <topic> <payload> <error>`; stops after --count rounds or
once --stop-file exists; then one JSON line {"acked", "errors"}.

`consume`: one consumer per topic on subscription --sub (from the earliest
message), acks every message and prints `REC <topic> <payload>`; stops once
--stop-file exists and nothing arrived for --idle-ms; then one JSON line
{"received": n}.

--url may list several brokers (`pulsar://h:p1,h:p2`): the client looks
each topic up and follows redirects.
"""
import argparse
import json
import os
import sys
import time

import pulsar


def main():
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("mode", choices=["produce", "consume"])
    p.add_argument("--url", required=True)
    p.add_argument("--topics", required=True, help="comma-separated")
    p.add_argument("--tag", default="m")
    p.add_argument("--count", type=int, default=0, help="rounds; 0 = until --stop-file")
    p.add_argument("--stop-file", default="")
    p.add_argument("--sub", default="s")
    p.add_argument("--idle-ms", type=int, default=3000)
    p.add_argument("--pause-ms", type=int, default=20)
    args = p.parse_args()
    topics = [t for t in args.topics.split(",") if t]
    extra = {}
    if os.environ.get("OWN_CLIENT_LOG"):
        import logging
        logging.basicConfig(stream=sys.stderr, level=logging.INFO,
                            format="%(asctime)s %(message)s")
        extra["logger"] = logging.getLogger("pulsar")
    client = pulsar.Client(args.url, operation_timeout_seconds=30,
                           connection_timeout_ms=5000, **extra)

    def stop_requested():
        return args.stop_file and os.path.exists(args.stop_file)

    try:
        if args.mode == "produce":
            producers = {t: client.create_producer(t, batching_enabled=False,
                                                   send_timeout_millis=0)
                         for t in topics}
            print("READY", flush=True)
            acked, errors, i = 0, [], 0
            while (args.count == 0 or i < args.count) and not stop_requested():
                for t in topics:
                    payload = f"{args.tag}-{i}"
                    try:
                        producers[t].send(payload.encode())
                        acked += 1
                        print(f"ACK {t} {payload} {int(time.time() * 1000)}", flush=True)
                    except Exception as e:  # noqa: BLE001 - every error is recorded
                        errors.append(f"{t} {payload}: {type(e).__name__}: {e}")
                        print(f"ERR {t} {payload} {type(e).__name__}", flush=True)
                i += 1
                time.sleep(args.pause_ms / 1000.0)
            for pr in producers.values():
                pr.close()
            print(json.dumps({"acked": acked, "errors": errors}), flush=True)
        else:
            consumers = {t: client.subscribe(
                t, args.sub, consumer_type=pulsar.ConsumerType.Shared,
                initial_position=pulsar.InitialPosition.Earliest)
                for t in topics}
            print("READY", flush=True)
            n, last = 0, time.time()
            while True:
                got = False
                for t, c in consumers.items():
                    try:
                        m = c.receive(timeout_millis=100)
                    except pulsar.Timeout:
                        continue
                    got = True
                    n += 1
                    print(f"REC {t} {m.data().decode()}", flush=True)
                    c.acknowledge(m)
                if got:
                    last = time.time()
                elif stop_requested() and (time.time() - last) * 1000 > args.idle_ms:
                    break
            for c in consumers.values():
                c.close()
            print(json.dumps({"received": n}), flush=True)
    except Exception as e:  # noqa: BLE001 - report any client error as a failure
        print(json.dumps({"error": f"{type(e).__name__}: {e}"}), flush=True)
        sys.exit(1)
    finally:
        client.close()


if __name__ == "__main__":
    main()
