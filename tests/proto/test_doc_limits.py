#!/usr/bin/env python3
"""Every connection and frame limit of k3d is documented, with the values
proto/k3_limits.h gives it, in docs/k3d.8 (CONNECTIONS and the options)
and in docs/protocol.md ("Limits") (issue 16, item 2). Changing a default
or bound in the header without the two documents fails here, naming the
sentence that no longer says it.

usage: test_doc_limits.py K3_LIMITS_H K3D_8 PROTOCOL_MD
"""
import re
import sys


def limits(path):
    """The header's #define values, evaluated (integer expressions only)."""
    vals = {}
    for name, expr in re.findall(r"^#define\s+(K3_LIM_\w+)\s+(.+?)\s*$", open(path).read(), re.M):
        expr = re.sub(r"\b(\d+)(?:ull|ul|u)\b", r"\1", expr)
        expr = re.sub(r"\bK3_LIM_\w+\b", lambda m: str(vals[m.group(0)]), expr)
        vals[name] = eval(expr, {"__builtins__": {}})
    return vals


def text(path):
    """The document with runs of white space as one space (man lines wrap)."""
    return " ".join(open(path).read().split())


def main():
    lim = limits(sys.argv[1])
    g = {k[len("K3_LIM_"):]: v for k, v in lim.items()}
    kib, mib = 1 << 10, 1 << 20
    small, large = g["PAYLOAD_SMALL"] // kib, g["PAYLOAD_MAX"] // mib
    conn = "%d\\(en%d (default %d)" % (g["CONNECTIONS_MIN"], g["CONNECTIONS_MAX"], g["CONNECTIONS_DEFAULT"])
    want = {
        sys.argv[2]: [
            conn,
            "(default %d, or .B \\-\\-max-connections if that is less)" % g["CONN_PER_UID_DEFAULT"],
            "The last %d of those outside the gateway's share are root's" % g["CONN_ROOT_RESERVED"],
            "(default %d, or a quarter of" % g["CONN_GATEWAY_DEFAULT"],
            "minus %d)" % (g["CONN_ROOT_RESERVED"] + 1),
            "(default %d; 0 = never; at most %d)" % (g["IDLE_TIMEOUT_DEFAULT_S"], g["IDLE_TIMEOUT_MAX_S"]),
            "HELLO must arrive within %d s of connecting" % g["HELLO_TIMEOUT_S"],
            "at most %d KiB for control messages and %d MiB" % (small, large),
            "%d MiB of announced payload in flight" % (g["INBUF_LARGE_TOTAL"] // mib),
            "once %d MiB are queued" % (g["CONN_OUTBUF"] // mib),
            "(0\\(en%d, default 0)" % g["QUEUE_MAX"],
        ],
        sys.argv[3]: [
            "`--max-connections`, default %d (%d-%d)" % (g["CONNECTIONS_DEFAULT"], g["CONNECTIONS_MIN"],
                                                         g["CONNECTIONS_MAX"]),
            "`--max-connections-per-uid`, default %d" % g["CONN_PER_UID_DEFAULT"],
            "| kept for root | %d of the connections" % g["CONN_ROOT_RESERVED"],
            "`--gateway-connections`, default %d" % g["CONN_GATEWAY_DEFAULT"],
            "| HELLO | within %d s of connecting |" % g["HELLO_TIMEOUT_S"],
            "`--idle-timeout`, default %d s (0 = never)" % g["IDLE_TIMEOUT_DEFAULT_S"],
            "%d KiB (small types), %d MiB (large types)" % (small, large),
            "%d × %d MiB announced payload" % (g["INBUF_LARGE_TOTAL"] // g["PAYLOAD_MAX"], large),
            "%d MiB queued" % (g["CONN_OUTBUF"] // mib),
            "`--queue`, default 0 (0-%d)" % g["QUEUE_MAX"],
        ],
    }
    failed = 0
    for doc, phrases in want.items():
        body = text(doc)
        for p in phrases:
            if p not in body:
                print(f"FAIL: {doc} does not say {p!r}")
                failed += 1
    print(f"{failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
