"""Produces one message and consumes it back with token authentication
(pulsar.AuthenticationToken); --token '' connects without authentication.
Prints {"received": ...} or {"error": ...}."""
import pulsar

import common

p = common.parser(__doc__)
p.add_argument("--token", default="")
p.add_argument("--sub", default="sub")
p.add_argument("--tls-trust-certs-file", default="")
args = p.parse_args()

kwargs = {}
if args.token:
    kwargs["authentication"] = pulsar.AuthenticationToken(args.token)
client = None
try:
    client = pulsar.Client(
        args.url,
        operation_timeout_seconds=max(1, args.timeout_ms // 1000),
        connection_timeout_ms=args.timeout_ms,
        # The client's log goes to stderr so that it never interleaves with
        # the JSON result line on stdout.
        logger=pulsar.FileLogger(pulsar.LoggerLevel.Info, "/dev/stderr"),
        tls_trust_certs_file_path=args.tls_trust_certs_file or None,
        tls_validate_hostname=bool(args.tls_trust_certs_file),
        **kwargs,
    )
    consumer = client.subscribe(args.topic, args.sub,
                                initial_position=pulsar.InitialPosition.Earliest)
    producer = client.create_producer(args.topic, send_timeout_millis=args.timeout_ms)
    producer.send(b"hello")
    m = consumer.receive(timeout_millis=args.timeout_ms)
    consumer.acknowledge(m)
    common.done({"received": m.data().decode(errors="replace")}, ok=True)
except Exception as e:  # noqa: BLE001
    common.done({"error": f"{type(e).__name__}: {e}"}, ok=False)
finally:
    if client is not None:
        client.close()
