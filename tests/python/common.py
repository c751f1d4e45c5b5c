"""Shared helpers of the test scripts: argument parsing, the client, JSON output."""
import argparse
import json
import sys

import pulsar


def parser(description):
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--url", required=True, help="pulsar://host:port")
    p.add_argument("--topic", required=True)
    p.add_argument("--timeout-ms", type=int, default=10000,
                   help="operation and receive timeout in milliseconds")
    return p


def client(args):
    return pulsar.Client(
        args.url,
        operation_timeout_seconds=max(1, args.timeout_ms // 1000),
        connection_timeout_ms=args.timeout_ms,
    )


def msg_id(m):
    mid = m.message_id()
    return [mid.ledger_id(), mid.entry_id(), mid.batch_index()]


def done(result, ok=True):
    print(json.dumps(result), flush=True)
    sys.exit(0 if ok else 1)
