"""Message size limit: a message just under the broker's max message size is
accepted and delivered intact; one byte over is refused by the client with
MessageTooBig; the producer and its connection keep working afterwards.

"Just under" is max - 64 bytes: the C++ client (4.2) counts the message
metadata (about 25 bytes here) with the payload against the limit the broker
advertised in CONNECTED, so max - 64 is within a few dozen bytes of the
largest message a client can send at all."""
import pulsar

import compat_util as u

UNDER_BY = 64


def blob(size, seed):
    pattern = bytes((seed + k) % 256 for k in range(256))
    return (pattern * (size // 256 + 1))[:size]


def main():
    p = u.parser(__doc__)
    p.add_argument("--max-bytes", type=int, required=True,
                   help="the broker's max message size (advertised in CONNECTED)")
    args = u.parse(p)
    c = u.Checks()
    client = u.client(args)
    topic = u.topic(args)
    consumer = client.subscribe(topic, "size", initial_position=pulsar.InitialPosition.Earliest,
                                receiver_queue_size=2)
    producer = client.create_producer(topic, send_timeout_millis=args.timeout_ms)
    under = blob(args.max_bytes - UNDER_BY, 1)
    over = blob(args.max_bytes + 1, 3)
    results = {}
    for name, data in (("under", under), ("over", over), ("after", b"small")):
        try:
            producer.send(data)
            results[name] = "Ok"
        except Exception as e:  # noqa: BLE001
            results[name] = f"{type(e).__name__}: {e}"
    c.equal("just under the limit is accepted", results["under"], "Ok")
    c.check("one byte over is refused with MessageTooBig",
            results["over"].startswith("MessageTooBig"), got=results["over"])
    c.equal("the producer keeps working after the refusal", results["after"], "Ok")

    expected = [("under", under), ("after", b"small")]
    expected = [(n, d) for n, d in expected if results[n] == "Ok"]
    got = []
    for _ in expected:
        m = u.receive_or_none(consumer, args.timeout_ms)
        if m is None:
            break
        got.append((len(m.data()), u.digest(m.data())))
        consumer.acknowledge(m)
    c.equal("the accepted messages arrive intact, in order", got,
            [(len(d), u.digest(d)) for _, d in expected])
    c.equal("the refused message is never delivered", u.drain_quiet(consumer, 500), [])
    consumer.close()
    u.finish(c, sends=results)


u.run(main)
