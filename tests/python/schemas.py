"""Schema registry checks with the official client against one broker: Avro
evolution (a compatible v2 accepted, a changed field type and a new field
without default refused with IncompatibleSchema under FULL), a consumer with
the v2 schema reading v1 data (its writer schema downloaded by GET_SCHEMA),
get_schema_info by version, JSON and String round trips, a type change
refused, a bytes producer accepted on a topic with a schema, one schema
for every partition of a partitioned topic.
Prints {"results": {name: ok|error}, "errors": {name: message}}."""
import sys
import time

import pulsar
from pulsar.schema import AvroSchema, Integer, JsonSchema, Record, String, StringSchema

import common

p = common.parser(__doc__)
args = p.parse_args()
c = common.client(args)
prefix = args.topic
results = {}
errors = {}


def check(name, f, expected):
    t = time.time()
    try:
        got = f()
        results[name] = "ok" if got == expected else f"got {got!r}, expected {expected!r}"
    except Exception as e:  # noqa: BLE001
        results[name] = f"{type(e).__name__}: {e}"
    print(name, results[name], f"{time.time() - t:.2f}s", file=sys.stderr, flush=True)


def refused(name, f):
    """Expects f() to raise; records the exception's text."""
    try:
        f()
    except Exception as e:  # noqa: BLE001
        errors[name] = f"{type(e).__name__}: {e}"
        return "refused"
    return "accepted"


def v1():
    class User(Record):
        name = String()
    return User


def v2():
    class User(Record):
        name = String()
        age = Integer(required_default=True)
    return User


def bad_type():
    class User(Record):
        name = Integer()
    return User


def no_default():
    class User(Record):
        name = String()
        age = Integer()
        email = String()
    return User


T = prefix + "-avro"
V1, V2 = v1(), v2()


def evolve():
    p1 = c.create_producer(T, schema=AvroSchema(V1))
    p1.send(V1(name="a"))
    p2 = c.create_producer(T, schema=AvroSchema(V2))
    p2.send(V2(name="b", age=7))
    # The same v1 schema again gets its version: accepted.
    p3 = c.create_producer(T, schema=AvroSchema(V1))
    p3.send(V1(name="c"))
    for x in (p1, p2, p3):
        x.close()
    return True


check("avro v1 then compatible v2", evolve, True)
check("avro field type changed refused",
      lambda: refused("type", lambda: c.create_producer(T, schema=AvroSchema(bad_type()))), "refused")
check("avro new field without default refused",
      lambda: refused("nodefault", lambda: c.create_producer(T, schema=AvroSchema(no_default()))), "refused")


def consume_v2():
    cons = c.subscribe(T, "s", schema=AvroSchema(V2), initial_position=pulsar.InitialPosition.Earliest)
    got = []
    for _ in range(3):
        m = cons.receive(args.timeout_ms)
        v = m.value()
        got.append([v.name, v.age, m._message.int_schema_version()])
        cons.acknowledge(m)
    cons.close()
    return got


check("consumer with v2 reads v1 and v2 data", consume_v2, [["a", None, 0], ["b", 7, 1], ["c", None, 0]])


def schema_info():
    out = []
    for v in (0, 1):
        info = c._client.get_schema_info(T, v)
        out.append([str(info.schema_type()), "age" in info.schema()])
    return out


check("get_schema_info by version", schema_info,
      [["SchemaType.AVRO", False], ["SchemaType.AVRO", True]])
check("get_schema_info of a missing version",
      lambda: refused("missing-version", lambda: c._client.get_schema_info(T, 9)), "refused")
check("consumer with an unreadable schema refused",
      lambda: refused("consumer", lambda: c.subscribe(T, "s2", schema=AvroSchema(no_default()))), "refused")


def bytes_producer():
    pb = c.create_producer(T)
    pb.send(b"raw")
    pb.close()
    return True


check("bytes producer on a topic with a schema", bytes_producer, True)


def json_round_trip():
    class Point(Record):
        x = Integer()
        label = String()
    t = prefix + "-json"
    cons = c.subscribe(t, "s", schema=JsonSchema(Point))
    pr = c.create_producer(t, schema=JsonSchema(Point))
    pr.send(Point(x=3, label="p"))
    m = cons.receive(args.timeout_ms)
    cons.acknowledge(m)
    v = m.value()
    pr.close()
    cons.close()
    return [v.x, v.label]


check("json round trip", json_round_trip, [3, "p"])


def string_round_trip():
    t = prefix + "-string"
    cons = c.subscribe(t, "s", schema=StringSchema())
    pr = c.create_producer(t, schema=StringSchema())
    pr.send("hello")
    m = cons.receive(args.timeout_ms)
    cons.acknowledge(m)
    pr.close()
    cons.close()
    return m.value()


check("string round trip", string_round_trip, "hello")
check("avro producer on a string topic refused",
      lambda: refused("string-to-avro",
                      lambda: c.create_producer(prefix + "-string", schema=AvroSchema(V1))), "refused")



def partitioned():
    # The test created "<prefix>-part" with 3 partitions: one schema for all.
    t = prefix + "-part"
    pr = c.create_producer(t, schema=AvroSchema(V1),
                           message_routing_mode=pulsar.PartitionsRoutingMode.RoundRobinDistribution)
    for i in range(6):
        pr.send(V1(name=f"p{i}"))
    pr.close()
    return refused("partitioned", lambda: c.create_producer(t, schema=AvroSchema(bad_type())))


check("partitioned topic shares one schema", partitioned, "refused")

c.close()
common.done({"results": results, "errors": errors}, all(v == "ok" for v in results.values()))
