"""``kernelbake admission``: the webhook server, and the same review for one file.

kernelbake admission --policy policy.yaml --tls-cert tls.crt --tls-key tls.key [--port 8443]
kernelbake admission review --policy policy.yaml [--endpoint validate] request.json
kernelbake admission check-policy policy.yaml
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import socket
import ssl
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from kernelbake.admission.bounds import MAX_CONNECTIONS
from kernelbake.contract import jsondoc
from kernelbake.errors import BadInput, EnvironmentProblem
from kernelbake.settings import Settings
from kernelbake.textfile import read_bytes, read_text

if TYPE_CHECKING:
    from kernelbake.admission.policy import AdmissionPolicy
    from kernelbake.admission.service import Admitter


def _admitter(policy_path: str) -> Admitter:
    # Imported here so that `kernelbake plan` does not pay for the signing stack.
    from kernelbake.admission.policy import load_admission_policy
    from kernelbake.admission.service import Admitter
    from kernelbake.admission.verifying import build_gateway

    policy = load_admission_policy(policy_path)
    return Admitter(policy, build_gateway(policy, settings=Settings.from_env()))


def _logging(level: str) -> None:
    logging.basicConfig(level=level.upper(), stream=sys.stderr, format="%(asctime)s %(name)s %(message)s")


def cmd_serve(args: argparse.Namespace) -> int:
    from kernelbake.admission.delta_reads import BUDGET as DELTA_BUDGET
    from kernelbake.admission.http import workers
    from kernelbake.admission.http.server import MAX_BODY, AdmissionServer, tls_context
    from kernelbake.admission.large_bodies import BodyBudget
    from kernelbake.admission.pod_facts import PodFacts
    from kernelbake.admission.policy import load_admission_policy
    from kernelbake.admission.service import Admitter
    from kernelbake.admission.verifying import build_gateway, verify_policy

    missing = [
        flag
        for flag, value in (
            ("--policy", args.policy),
            ("--tls-cert", args.tls_cert),
            ("--tls-key", args.tls_key),
        )
        if not value
    ]
    if missing:
        raise BadInput(f"{', '.join(missing)} required to serve (or use `kernelbake admission review`)")
    if args.workers < 1:
        raise BadInput(f"--workers {args.workers}: at least 1")
    _logging(args.log_level)
    # Everything that can be wrong is found here, before a socket is bound or a worker forked.
    policy = load_admission_policy(args.policy)
    verify_policy(policy)
    _say_what_is_permissive(policy)
    cert, key = _tls_files(args, tls_context)
    client_ca = _client_ca(args)
    sockets, health = _listen(args)
    print(
        f"kernelbake admission: listening on https://{args.host}:{sockets[0].getsockname()[1]} "
        f"(policy {policy.source}: {policy.mode.value}, {len(policy.images)} pattern(s), "
        f"{args.workers} worker(s); clients: {_clients(client_ca)})",
        file=sys.stderr,
        flush=True,
    )
    if health is not None:
        print(
            f"kernelbake admission: probes on http://{args.host}:{health.getsockname()[1]} (/healthz, /readyz)",
            file=sys.stderr,
            flush=True,
        )

    # Made before the fork: the workers share the pod's memory, so they share these budgets.
    bodies = BodyBudget(MAX_BODY)
    deltas = BodyBudget(DELTA_BUDGET)
    # One parse of each delta.json for the pod, whichever worker is asked first.
    delta_facts = PodFacts()

    def serve(sock: socket.socket) -> int:
        # Built in the worker: the verification pool's threads must not cross a fork.
        gateway = build_gateway(
            policy, settings=Settings.from_env(), delta_budget=deltas, delta_facts=delta_facts
        )
        admitter = Admitter(policy, gateway)
        server = AdmissionServer(
            admitter,
            cert=cert,
            key=key,
            sock=sock,
            bodies=bodies,
            max_connections=args.max_connections,
            client_ca=client_ca,
            unsafe_any_client=client_ca is None,
            # One listening socket for the probes, accepted from by every worker.
            health_sock=health,
        )
        asyncio.run(server.serve())
        return 0

    if args.workers == 1:
        return serve(sockets[0])
    return workers.run(sockets, serve)


def _tls_files(args: argparse.Namespace, tls_context: Callable[[Path, Path], object]) -> tuple[Path, Path]:
    """The serving certificate and key, each read and the pair loaded before anything is bound."""
    cert, key = Path(args.tls_cert), Path(args.tls_key)
    for flag, path, what in (("--tls-cert", cert, "the certificate"), ("--tls-key", key, "the key")):
        # Checked with the bounded reader first: OpenSSL would wait on a FIFO or read a device.
        try:
            read_bytes(path, what)
        except BadInput as exc:
            raise BadInput(f"{flag} {exc.message}", hint="deploy/make-cert.sh makes one") from None
    try:
        tls_context(cert, key)
    except (OSError, ssl.SSLError) as exc:
        raise BadInput(
            f"--tls-cert {cert} / --tls-key {key}: not a PEM certificate and its private key ({exc})"
        ) from None
    return cert, key


def _client_ca(args: argparse.Namespace) -> Path | None:
    """The CA whose client certificates may connect; None only with ``--unsafe-any-client``.
    Fails closed: neither is bad input, before anything listens."""
    if args.unsafe_any_client:
        logging.getLogger("kernelbake.admission").warning(
            "--unsafe-any-client: UNSAFE: any client that reaches the port may connect, hold "
            "connections and read which images verify; give --client-ca, the CA of the API "
            "server's client certificate (docs/admission.md, Who may connect)"
        )
        return None
    if args.client_ca is None:
        raise BadInput(
            "--client-ca FILE is required to serve: the webhook serves only the API server, by the "
            "client certificate this CA issued",
            hint="deploy/make-cert.sh makes the CA and the API server's certificate (docs/admission.md, "
            "Who may connect); --unsafe-any-client serves any client that reaches the port",
        )
    path = args.client_ca
    try:
        read_bytes(Path(path), "the client CA")
        ssl.create_default_context(cafile=path)
    except BadInput as exc:
        raise BadInput(f"--client-ca {exc.message}") from None
    except (OSError, ssl.SSLError) as exc:
        raise BadInput(f"--client-ca {path}: not a PEM CA certificate ({exc})") from None
    return Path(path)


def _clients(client_ca: Path | None) -> str:
    """Who may connect, as the start line says it."""
    if client_ca is None:
        return "ANY, --unsafe-any-client"
    return f"certificates from {client_ca}"


def _listen(args: argparse.Namespace) -> tuple[list[socket.socket], socket.socket | None]:
    """The workers' sockets on --port and the probes' one on --health-port (None without)."""
    from kernelbake.admission.http import workers

    def listen(flag: str, port: int, count: int) -> list[socket.socket]:
        try:
            return workers.listening_sockets(args.host, port, count)
        except OSError as exc:
            raise EnvironmentProblem(
                f"--host {args.host} {flag} {port}: cannot listen: {exc.strerror or exc}"
            ) from None

    sockets = listen("--port", args.port, args.workers)
    if args.health_port is None:
        return sockets, None
    try:
        return sockets, listen("--health-port", args.health_port, 1)[0]
    except EnvironmentProblem:
        for sock in sockets:
            sock.close()
        raise


def _say_what_is_permissive(policy: AdmissionPolicy) -> None:
    from kernelbake.admission.policy import Mode, OnRegistryError

    log = logging.getLogger("kernelbake.admission")
    if policy.mode is Mode.WARN:
        log.warning("%s: mode warn: nothing is denied, problems only become warnings", policy.source)
    if policy.registry_errors is OnRegistryError.UNSAFE_ALLOW:
        log.warning(
            "%s: registry_errors unsafe-allow: when the registry fails, images are admitted unverified",
            policy.source,
        )


def _stdin_text(limit: int) -> str:
    # The same bound as a file (the webhook's body limit): stdin may be /dev/zero.
    data = sys.stdin.buffer.read(limit + 1)
    if len(data) > limit:
        raise BadInput(f"<stdin>: the AdmissionReview is over the {limit}-byte limit")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise BadInput(f"<stdin>: the AdmissionReview is not UTF-8 text (offset {exc.start})") from None


def cmd_review(args: argparse.Namespace) -> int:
    from kernelbake.admission.admit import Endpoint
    from kernelbake.admission.http.server import MAX_BODY

    _logging("warning")
    source = "<stdin>" if args.request == "-" else args.request
    try:
        if args.request == "-":
            text = _stdin_text(MAX_BODY)
        else:
            text = read_text(args.request, "the AdmissionReview", limit=MAX_BODY)
        doc = jsondoc.loads(text)
    except OSError as exc:
        raise BadInput(f"{source}: cannot read: {exc.strerror or exc}") from None
    except (ValueError, RecursionError) as exc:
        raise BadInput(f"{source}: not JSON ({exc}); the webhook answers such a body with HTTP 400") from None
    admitter = _admitter(args.policy)
    try:
        answer = admitter.review(doc, Endpoint(args.endpoint))
    finally:
        admitter.gateway.close()
    print(json.dumps(answer, indent=2))
    response = answer["response"]
    if not response["allowed"]:
        print(f"denied: {response['status']['message']}", file=sys.stderr)
        return 1
    return 0


def cmd_check_policy(args: argparse.Namespace) -> int:
    from kernelbake.admission.policy import load_admission_policy
    from kernelbake.admission.verifying import verify_policy

    policy = load_admission_policy(args.policy)
    trust = verify_policy(policy)
    print(
        f"{policy.source}: ok: {policy.mode.value} mode, gpu.match {policy.gpu_match.value}, "
        f"registry_errors {policy.registry_errors.value}; governs {', '.join(policy.images)}; "
        f"trusts {trust.describe()}"
    )
    return 0


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "admission",
        help="Kubernetes admission webhook: admit only signed kernel-cache images on their GPUs",
        description="Serve the validating and mutating webhook (POST /mutate, /validate; GET /healthz).",
    )
    p.add_argument("--policy", help="admission policy YAML (see deploy/policy.yaml)")
    p.add_argument("--tls-cert", help="serving certificate (PEM), e.g. from deploy/make-cert.sh")
    p.add_argument("--tls-key", help="its private key (PEM)")
    p.add_argument("--host", default="0.0.0.0", help="address to listen on (default 0.0.0.0)")
    p.add_argument("--port", type=int, default=8443, help="port (default 8443; 0 picks a free one)")
    p.add_argument(
        "--workers",
        type=int,
        default=1,
        help="server processes sharing the port (SO_REUSEPORT), each with its own cache (default 1)",
    )
    p.add_argument(
        "--max-connections",
        type=int,
        default=MAX_CONNECTIONS,
        metavar="N",
        help=f"connections each worker holds at once, TLS handshakes included; one more is dropped "
        f"before its handshake, and logged (default {MAX_CONNECTIONS})",
    )
    p.add_argument(
        "--health-port",
        type=int,
        metavar="PORT",
        help="also serve GET /healthz and /readyz over plain HTTP on this port, for the kubelet's "
        "probes: a listener the webhook's clients cannot fill (0 picks a free one; default: none)",
    )
    clients = p.add_mutually_exclusive_group()
    clients.add_argument(
        "--client-ca",
        metavar="FILE",
        help="only clients with a certificate for client authentication this CA issued may connect "
        "(the API server's, from deploy/make-cert.sh); required unless --unsafe-any-client",
    )
    clients.add_argument(
        "--unsafe-any-client",
        action="store_true",
        help="UNSAFE: serve any client that reaches the port, without a client certificate (said at "
        "start and in the probes' answers); for a control plane that cannot show one, behind a "
        "NetworkPolicy narrowed to its addresses",
    )
    p.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    p.set_defaults(func=cmd_serve)
    actions = p.add_subparsers(dest="action", metavar="ACTION")

    r = actions.add_parser(
        "review",
        help="review one AdmissionReview document, print the answer (exit 0 allowed, 1 denied)",
    )
    r.add_argument("--policy", required=True, help="admission policy YAML")
    r.add_argument("--endpoint", choices=["mutate", "validate"], default="mutate", help="default mutate")
    r.add_argument("request", help="AdmissionReview JSON file, or - for stdin")
    r.set_defaults(func=cmd_review)

    c = actions.add_parser("check-policy", help="validate a policy file (exit 2 with file:field if bad)")
    c.add_argument("policy")
    c.set_defaults(func=cmd_check_policy)
