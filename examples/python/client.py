#!/usr/bin/env python3
"""Streams (or, with --unary, fetches) one completion from Switchyard.

Stubs are generated from ../../proto at start-up, so the client always matches
the checked-out contract. Exits 1 on a gRPC error, printing the status code,
message and google.rpc.ErrorInfo reason to stderr.
"""
import argparse
import pathlib
import sys
import tempfile

import grpc
from google.rpc import error_details_pb2
from grpc_status import rpc_status
from grpc_tools import protoc

PROTO_ROOT = pathlib.Path(__file__).resolve().parent.parent.parent / "proto"
PROTO_FILE = "switchyard/v1/switchyard.proto"


def load_stubs(out_dir):
    # grpc_tools ships the well-known types; pass them as an include path too.
    wkt = pathlib.Path(protoc.__file__).parent / "_proto"
    rc = protoc.main([
        "grpc_tools.protoc",
        f"-I{PROTO_ROOT}",
        f"-I{wkt}",
        f"--python_out={out_dir}",
        f"--grpc_python_out={out_dir}",
        PROTO_FILE,
    ])
    if rc != 0:
        sys.exit(f"error: protoc failed on {PROTO_ROOT / PROTO_FILE}")
    sys.path.insert(0, out_dir)
    from switchyard.v1 import switchyard_pb2, switchyard_pb2_grpc
    return switchyard_pb2, switchyard_pb2_grpc


def summary(pb, served_by, tier, finish_reason, attempts, usage, request_id):
    return (
        f"served_by={served_by.provider}/{served_by.model}"
        f" tier={pb.Tier.Name(tier)}"
        f" finish={pb.FinishReason.Name(finish_reason)}"
        f" attempts={attempts}"
        f" usage=in:{usage.input_tokens},out:{usage.output_tokens}"
        + (",estimated" if usage.estimated else "")
        + f" request_id={request_id}"
    )


def stream(pb, stub, request, timeout):
    for event in stub.StreamCompletion(request, timeout=timeout):
        kind = event.WhichOneof("event")
        if kind == "delta":
            print(event.delta.text, end="", flush=True)
        elif kind == "reset":
            # The attempt failed after output: discard it, a new answer follows.
            print(f"\n[reset: {event.reset.reason}]", flush=True)
        elif kind == "finished":
            f = event.finished
            print()
            print(summary(pb, f.served_by, f.tier, f.finish_reason,
                          f.attempts, f.usage, f.request_id))


def unary(pb, stub, request, timeout):
    r = stub.Complete(request, timeout=timeout)
    print(r.text)
    print(summary(pb, r.served_by, r.tier, r.finish_reason,
                  r.attempts, r.usage, r.request_id))


def report(err):
    line = f"error: {err.code().name}: {err.details()}"
    try:
        status = rpc_status.from_call(err)
    except ValueError:  # trailer disagrees with the status line
        status = None
    for detail in status.details if status else []:
        info = error_details_pb2.ErrorInfo()
        if detail.Unpack(info):
            line += f" (reason={info.reason}"
            line += "".join(f" {k}={v}" for k, v in sorted(info.metadata.items()))
            line += ")"
    print(line, file=sys.stderr)


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--target", default="127.0.0.1:50051", help="HOST:PORT")
    p.add_argument("--route", default="chat")
    p.add_argument("--prompt", default="Say hello.")
    p.add_argument("--max-tokens", type=int, default=0, help="0: the route's default")
    p.add_argument("--timeout", type=float, default=60.0, help="deadline in seconds")
    p.add_argument("--unary", action="store_true", help="call Complete instead of StreamCompletion")
    args = p.parse_args()

    with tempfile.TemporaryDirectory(prefix="switchyard-stubs-") as gen:
        pb, pb_grpc = load_stubs(gen)
        request = pb.CompletionRequest(
            route=args.route,
            messages=[pb.Message(role="user", content=args.prompt)],
            max_tokens=args.max_tokens,
        )
        with grpc.insecure_channel(args.target) as channel:
            stub = pb_grpc.RouterStub(channel)
            try:
                (unary if args.unary else stream)(pb, stub, request, args.timeout)
            except grpc.RpcError as err:
                report(err)
                return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
