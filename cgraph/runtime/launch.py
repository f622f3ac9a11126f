"""Turn a planned schedule into running actor loops and a driver ``CompiledGraph``.

1. allocate one channel resource per ``ChannelSpec`` (shared memory for SHM,
   nothing for INTRA: those live inside the actor);
2. build each actor's ``ActorProgram`` (its ops, compute specs, endpoint handles);
3. start each loop on a thread of its actor (``hosting.py``: an actor may run the loops
   of several graphs) and a monitor that watches them (``monitor.py``);
4. hand the driver its input writer and output readers.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Mapping
from dataclasses import replace
from typing import TYPE_CHECKING, cast

import ray

from cgraph._boundary import ActorHandle, RayObject
from cgraph._log import logger
from cgraph.channels import tls
from cgraph.channels.base import ChannelWriter
from cgraph.channels.handshake import new_secret
from cgraph.channels.opener import open_reader, open_writer
from cgraph.channels.relay import RelayHandle
from cgraph.channels.segments import cleanup_stale_segments
from cgraph.channels.shm_channel import ShmHandle
from cgraph.comm.gpu_placement import placement
from cgraph.dag.actor_table import STARTING, actor_state
from cgraph.errors import CompileError
from cgraph.ir import DRIVER, Graph, NodeKind
from cgraph.runtime.affinity import choose_cpus, pin_thread
from cgraph.runtime.auto_overlap import AutoOverlap
from cgraph.runtime.communicators import setup_communicators
from cgraph.runtime.compiled_graph import CompiledGraph, DriverEndpoints, InputUsage
from cgraph.runtime.endpoints import (
    CopyingReader,
    FanOutWriter,
    create_channel,
    remote_segments,
    socket_channel,
)
from cgraph.runtime.monitor import WATCHER, LoopMonitor
from cgraph.runtime.node_channels import NodeWatch, RemoteSegments, make_remote
from cgraph.runtime.options import CompileOptions
from cgraph.runtime.program import ActorProgram, compute_spec
from cgraph.runtime.timeline import ray_profiling, records, torch_profiles
from cgraph.scheduler.ops import OpKind

if TYPE_CHECKING:
    from cgraph.channels.base import ChannelHandle
    from cgraph.dag import FrontEnd
    from cgraph.runtime.compiled_graph import DriverResource
    from cgraph.runtime.endpoints import Resource
    from cgraph.scheduler import Planned

def input_usage(graph: Graph) -> InputUsage:
    whole = False
    positions: set[int] = set()
    keys: set[str] = set()
    for node in graph.nodes:
        if node.kind is NodeKind.INPUT_ATTR:
            if isinstance(node.key, int):
                positions.add(node.key)
            else:
                keys.add(cast(str, node.key))  # INPUT_ATTR: an int or a str
    consumers = graph.consumers()
    inp = graph.input_node()
    if inp is not None:
        whole = any(graph.node(c).kind is not NodeKind.INPUT_ATTR for c in consumers[inp.id])
        whole = whole or inp.id in graph.outputs
    return InputUsage(whole, frozenset(positions), frozenset(keys))


def _output_spec(graph: Graph) -> tuple[tuple[str, int | str | None], ...]:
    spec: list[tuple[str, int | str | None]] = []
    for out in graph.outputs:
        node = graph.node(out)
        if node.kind is NodeKind.INPUT:
            spec.append(("input", None))
        elif node.kind is NodeKind.INPUT_ATTR:
            spec.append(("input", node.key))
        else:
            spec.append(("node", out))
    return tuple(spec)


def _allocate(planned: Planned, handles: Mapping[str, ActorHandle], tag: str, options: CompileOptions,
              secret: bytes, resources: dict[str, DriverResource], use_tls: bool) -> None:
    """Make every channel into ``resources`` (also when one fails, so all can be freed):
    other nodes' shared memory first, through one actor of each (its *agent*)."""
    graph: Graph = planned.graph
    wanted = remote_segments(planned)
    agents = {a.host: handles[a.id] for a in reversed(graph.actors) if a.host in wanted}
    resources[f"{tag}.nodes"] = made = RemoteSegments(agents, wanted)
    made.handles = make_remote(wanted, agents, tag, options.max_inflight_executions,
                               options.buffer_size_bytes)
    for spec in planned.plan.channels:
        ends = (_describe(graph, "writer", spec.writer), _describe(graph, "reader", spec.readers[0]))
        resources[spec.id] = create_channel(spec, tag=tag, options=options, secret=secret, ends=ends,
                                            remote=made.handles, tls=use_tls)


def _node_watch(actor: str, program: ActorProgram, tag: str, secret: bytes,
                resources: dict[str, DriverResource], use_tls: bool) -> NodeWatch | None:
    """For an actor off the driver's node that uses its node's shared memory: a channel
    the driver closes to close them (teardown, a failure) and their names; else None."""
    handles = [*program.readers.values(), *(h for hs in program.writers.values() for h in hs)]
    names = sorted({h.name for h in handles if isinstance(h, ShmHandle)}
                   | {h.shm_reader.name for h in handles if isinstance(h, RelayHandle)})
    if not names:
        return None
    watch = socket_channel(tag, f"{actor}.watch", 1, secret=secret, tls=use_tls)
    resources[f"{tag}.{actor}.watch"] = watch
    return NodeWatch(watch.reader_handle(), tuple(names))


def _describe(graph: Graph, role: str, actor: str) -> str:
    """``writer a (Worker) on node 3f2a1b9c`` (``the driver`` for the driver), for errors."""
    if actor == DRIVER:
        return "the driver"
    found = graph.actor(actor)
    where = f"node {found.host[:8]}" if found.host else "the driver's node"
    return f"{role} {found.id} ({found.cls}) on {where}"


def _program(actor: str, label: str, planned: Planned, resources: Mapping[str, Resource], tag: str) -> ActorProgram:
    graph, plan = planned.graph, planned.plan
    readers: dict[str, ChannelHandle] = {}
    writers: dict[str, tuple[ChannelHandle, ...]] = {}
    computes = {}
    for op in planned.schedule[actor]:
        if op.kind is OpKind.READ:
            spec = plan.for_reader(op.node, actor)
            assert spec is not None  # every READ has its channel
            readers[op.node] = resources[spec.id].reader_handle(actor)
        elif op.kind is OpKind.WRITE:
            writers[op.node] = tuple(
                resources[s.id].writer_handle() for s in plan.for_node(op.node) if s.kind.name != "COMM"
            )
        elif op.kind is OpKind.COMPUTE:
            computes[op.node] = compute_spec(graph.node(op.node), graph)
    inp = graph.input_node()
    return ActorProgram(
        actor=actor,
        label=label,
        graph_tag=tag,
        ops=planned.schedule[actor],
        computes=computes,
        readers=readers,
        writers=writers,
        input_node=inp.id if inp is not None else None,
    )


def _driver_endpoints(planned: Planned, resources: Mapping[str, Resource]) -> DriverEndpoints:
    graph, plan = planned.graph, planned.plan
    inp = graph.input_node()
    writer: ChannelWriter | FanOutWriter | None = None
    specs = plan.for_node(inp.id) if inp is not None else ()
    if len(specs) == 1:
        writer = open_writer(resources[specs[0].id].writer_handle())
    elif specs:  # readers on several nodes: one channel per node
        writer = FanOutWriter([open_writer(resources[spec.id].writer_handle()) for spec in specs])
    readers = {}
    for kind, node in _output_spec(graph):
        if kind == "node" and node not in readers:
            assert isinstance(node, str)  # ("node", node id)
            spec = plan.for_reader(node, DRIVER)
            assert spec is not None  # every output the driver reads has its channel
            readers[node] = CopyingReader(open_reader(resources[spec.id].reader_handle(DRIVER)))
    return DriverEndpoints(writer, readers, _output_spec(graph), list(resources.values()))


def _serializes_methods(handle: ActorHandle) -> bool:
    """Whether the actor runs one method at a time, in order (Ray's default actor: no
    ``max_concurrency`` above 1, no ``async def``): then its graphs' loops share its
    method lock (``hosting.py``). Ray decides this from the same two options."""
    return not getattr(handle, "_ray_allow_out_of_order_execution", False)


def _free(resources: dict[str, DriverResource], close: bool = False) -> None:
    """Free the channels of a compile that failed (``close``: wake the loops that started)."""
    for res in resources.values():
        if close:
            res.close()
        res.unlink()
        if isinstance(res, RemoteSegments):
            res.discard()


def _clean_stale() -> None:
    removed = cleanup_stale_segments()  # left by drivers that died without teardown
    if removed:
        logger.info("removed %d stale shared-memory segment(s) of dead cgraph drivers", len(removed))


def launch(front: FrontEnd, planned: Planned, options: CompileOptions) -> CompiledGraph:
    """Allocate channels, start the actor loops, and return the driver's graph object."""
    graph: Graph = planned.graph
    handles = front.handles
    _clean_stale()
    tag = uuid.uuid4().hex[:8]
    secret = new_secret()  # reaches the actors inside their programs, through Ray's own calls
    use_tls = tls.wanted(options.tls)
    labels = {a.id: f"{a.id} ({a.cls})" for a in graph.actors}
    resources: dict[str, DriverResource] = {}
    try:
        _allocate(planned, handles, tag, options, secret, resources, use_tls)
        comm = setup_communicators(front, planned, tag, options,  # groups + side channels
                                   sockets={"secret": secret, "tls": use_tls})
        resources[f"{tag}.communicators"] = comm
        passes = dict(planned.passes)
        auto = (AutoOverlap.start(graph, passes["lower"], passes.get("overlap", planned.schedule),
                                  options.auto_executions, records(options), ahead=passes.get("ahead"))
                if options.overlap_gpu_communication == "auto" else None)
        cpus = choose_cpus(options.cpu_affinity)
        local = {a.id for a in graph.actors if not a.host}
        programs = {}
        for a in planned.schedule:
            program = _program(a, labels[a], planned, cast("Mapping[str, Resource]", resources), tag)  # by channel id
            watch = _node_watch(a, program, tag, secret, resources, use_tls) if a not in local else None
            programs[a] = replace(program, comm=comm.program_of(a), node_watch=watch,
                                  cpu_affinity=cpus if a in local else None,
                                  serialize_methods=_serializes_methods(handles[a]),
                                  timeline=(options.timeline_executions if records(options)
                                            else options.auto_executions if auto else None),
                                  ray_events=ray_profiling(), torch_profiles=torch_profiles())
            if auto is not None:  # starts on one schedule, may switch to the other (switches.py)
                programs[a] = replace(programs[a], ops=auto.schedule()[a],
                                      schedules={name: s[a] for name, s in auto.schedules.items()})
        endpoints = _driver_endpoints(planned, cast("Mapping[str, Resource]", resources))
    except Exception:
        _free(resources)
        raise
    try:
        ends = WATCHER.start(handles, programs, tag)
    except Exception:  # an actor could not start its loop: those that did see their channels close
        _free(resources, close=True)
        raise
    unpin_driver = pin_thread(cpus)
    compiled = CompiledGraph(
        graph=graph,
        planned=planned,
        options=options,
        endpoints=endpoints,
        input_usage=input_usage(graph),
        loops=ends,
        labels=labels,
        multi_output=graph.multi_output,
        handles={a: handles[a] for a in planned.schedule},
        on_teardown=unpin_driver,
        tag=tag,
        auto=auto,
    )
    compiled._start_monitor(LoopMonitor(ends, labels, compiled._fail))
    return compiled


LOCATE_TIMEOUT_S = 60.0
"""How long a started actor may take to answer compile's one call before compile gives up
on it as busy. An actor still being created (``actor_table.STARTING``) is waited for."""
POLL_S = 1.0
"""How often compile asks the GCS about actors it has not yet seen started."""


def locate_actors(front: FrontEnd) -> Graph:
    """The front end's graph with each actor's ``host`` ("" = the driver's node) and
    ``devices`` (the GPU ids Ray assigned it) filled in: one call per actor, the only
    time compile asks where actors are (``_locate``).

    Raises:
        CompileError: an actor of the DAG is not started (a ``Worker.bind()``
            ClassNode), Ray is not initialised, or a started actor did not answer
            within ``LOCATE_TIMEOUT_S``.
    """
    from dataclasses import replace

    graph: Graph = front.graph
    unstarted = [a for a, h in front.handles.items() if not isinstance(h, ray.actor.ActorHandle)]
    if unstarted:
        raise CompileError(
            f"actor(s) {', '.join(unstarted)} of this DAG are not started (bound with "
            "Worker.bind()); compile needs live actors: create them with Worker.remote() "
            "and bind their methods, or use cgraph.plan(dag) to inspect the schedule only"
        )
    refs = {a: h.__ray_call__.remote(_locate) for a, h in front.handles.items()}
    _wait_for_answers(refs, front.handles)
    places = dict(zip(refs, ray.get(list(refs.values())), strict=True))
    here = ray.get_runtime_context().get_node_id()
    actors = tuple(replace(a, host="" if places[a.id][0] == here else places[a.id][0],
                           devices=places[a.id][1] if a.gpus > 0 else None)
                   for a in graph.actors)
    return replace(graph, actors=actors)


def _wait_for_answers(refs: Mapping[str, RayObject], handles: Mapping[str, ActorHandle]) -> None:
    """Until every actor answered its call. An actor Ray is still creating (a worker
    starting on a loaded machine, a runtime environment being set up) is waited for; an
    actor is busy, an error, once it did not answer for ``LOCATE_TIMEOUT_S`` after compile
    first saw it started (the GCS table is asked each ``POLL_S`` about those not seen up)."""
    pending, up_since = dict(refs), dict[str, float]()
    while pending:
        ready, _ = ray.wait(list(pending.values()), num_returns=len(pending), timeout=POLL_S)
        pending = {a: r for a, r in pending.items() if r not in ready}
        now = time.monotonic()
        for a in sorted(pending.keys() - up_since.keys()):
            state = actor_state(handles[a])
            if state in STARTING:
                logger.info("compile: waiting for Ray to start actor %s (%s)", a, state)
            else:
                up_since[a] = now
        busy = sorted(a for a in pending if a in up_since and now - up_since[a] >= LOCATE_TIMEOUT_S)
        if busy:
            raise CompileError(
                f"actor(s) {', '.join(busy)} of this DAG did not answer within "
                f"{LOCATE_TIMEOUT_S:g} s; they are busy (a long method call, or the loop of a "
                "compiled graph created by another driver): wait for them or use other actors"
            )


def _locate(actor: object) -> tuple[str, tuple[str, ...]]:
    """In an actor: where Ray put it (``gpu_placement.placement``). Defined here so that
    the actor imports this module, and with it the loop's (the executor's), now and not
    in its loop's first run. That import is about 0.3 s of CPU; taken at the loop's start,
    it left the loop on the other vCPU from the driver in every run measured (echo 95-140
    us median, 10 of 10 rounds), while taken here the kernel puts the loop beside the
    driver in about two rounds of three (22-40 us; docs/design-notes.md, "Latency on an
    idle VM")."""
    return placement(actor)
