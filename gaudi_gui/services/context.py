"""The services the whole window shares, built once in ``gaudi_gui.app.create_services``."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from PySide6.QtCore import QObject

    from gaudi_gui.services.agent_client import AgentClient
    from gaudi_gui.services.device_poller import DevicePoller
    from gaudi_gui.services.device_selection import DeviceSelection
    from gaudi_gui.services.downloads import ModelPlaces
    from gaudi_gui.services.environment_probe import EnvironmentProbe
    from gaudi_gui.services.evaluation import EvaluationService
    from gaudi_gui.services.generation_client import GenerationClient
    from gaudi_gui.services.health import HealthService
    from gaudi_gui.services.hosts import HostsService
    from gaudi_gui.services.jobs import JobRegistry
    from gaudi_gui.services.notifier import Notifier
    from gaudi_gui.services.preflight import PreflightService
    from gaudi_gui.services.queue import HostQueueService, JobQueue, QueueService
    from gaudi_gui.services.remote_files import RemoteFiles
    from gaudi_gui.services.schema import SchemaLoader
    from gaudi_gui.services.serve import ServeService
    from gaudi_gui.services.settings import Settings
    from gaudi_gui.services.training import TrainingService


@dataclass
class AppServices:
    settings: Settings
    #: The cards checked in the Devices tab; runner and training take their child env from it.
    selection: DeviceSelection
    #: Versions and the device a worker will use, probed in a child process.
    environment: EnvironmentProbe
    #: Every job owner of every kind (training, Serve, Evaluate windows, the runner): what the close
    #: dialog lists and the status bar counts.
    jobs: JobRegistry
    #: Live hl-smi / nvidia-smi / host samples (one poller for the whole window), once made: read it as
    #: ``poller``, which makes it on first use (the app paints its window before loading its modules).
    device_poller: DevicePoller | None = None
    #: The training supervisor: current and re-attached runs, their card claims (None only in
    #: tests that build services by hand; ``gaudi_gui.app.create_services`` always makes one).
    training: TrainingService | None = None
    #: Each remote host's card selection, by host name: the Hosts tab's panels set them, and the
    #: runner takes a remote worker's device environment (sent as guard arguments) from them.
    host_selections: dict[str, DeviceSelection] = field(default_factory=dict)
    #: Every watched host's doctor report and the alerts (None only in tests that build services
    #: by hand); started by the app after the first paint.
    health: HealthService | None = None
    #: Desktop notifications for alerts and ended runs.
    notifier: Notifier | None = None
    #: The start gate's doctor children (Training's Start, the runner's Load): ``ensure_preflight``.
    preflight: PreflightService | None = None
    #: The TrainingArguments schema and validation children: ``ensure_schema``.
    schema: SchemaLoader | None = None
    #: The Evaluate job (the agent's job of kind eval, here or on a saved host): ``ensure_evaluation``.
    evaluation: EvaluationService | None = None
    #: The saved hosts in memory (the one reader/writer of hosts.json), each host's card selection,
    #: pollers, handshakes, ``ssh -G`` addresses and set-up: ``ensure_hosts`` (create_services makes it).
    hosts: HostsService | None = None
    #: The model runner's worker (``python -m gaudi_gui.workers.generate``): ``ensure_generation``.
    generation: GenerationClient | None = None
    #: A host's folders and Hub cache listed over ssh (the Browse dialog): ``ensure_remote_files``.
    remote_files: RemoteFiles | None = None
    #: The Serve panel's server (the agent's job of kind serve, here or on a saved host): ``ensure_serve``.
    serve: ServeService | None = None
    #: Hub downloads and model listings on this machine and the hosts (the Models tab):
    #: ``ensure_models``; registered in ``jobs``.
    models: ModelPlaces | None = None
    #: This machine's queue as its agent keeps it (issue 29, 38): ``ensure_queue``.
    queue: QueueService | None = None
    #: Saved hosts' queues as each host's agent says them (its ``queue`` events, through this machine's
    #: agent): ``ensure_host_queue``; the Hosts overview's queue length, the Queue view's selector.
    host_queues: dict[str, HostQueueService] = field(default_factory=dict)
    #: The window's one connection to this machine's agent (docs/agent-protocol.md), which owns all
    #: work: ``ensure_agent`` makes it and starts connecting (the agent is started when none runs).
    agent: AgentClient | None = None

    @property
    def poller(self) -> DevicePoller:
        """The window's device poller (not started), made on first use (``ensure_poller``)."""
        if self.device_poller is None:
            return self.ensure_poller(self.settings.parent())
        return self.device_poller

    def ensure_poller(self, parent: QObject | None = None) -> DevicePoller:
        """The device poller of this machine's cards, made here the first time (nothing started)."""
        if self.device_poller is None:
            from gaudi_gui.services.device_poller import DevicePoller
            # Its cards come from the agent's one loop (no hl-smi of the window's own).
            self.device_poller = DevicePoller(self.settings, self.selection, parent,
                                              agent=lambda: self.ensure_agent(parent))
        return self.device_poller

    def machine(self) -> dict[str, str]:
        """This machine as an FP8 calibration's manifest records it (``core.fp8.machine_of``: device type
        and card generation), from what the window already has: the device tools' kind and the names
        of the cards the agent's one hl-smi loop sent (the window runs no tool of its own)."""
        from gaudi_gui.core import fp8
        samples = self.device_poller.latest() if self.device_poller is not None else []
        return fp8.machine_of(self.selection.kind, [s.name or "" for s in samples if s.kind != "host"])

    def ensure_hosts(self, parent: QObject | None = None) -> HostsService:
        """The host list, read from hosts.json once here; every saved host gets its card selection
        (in ``host_selections``) now, not when its panel first opens."""
        if self.hosts is None:
            from gaudi_gui.services.hosts import HostsService
            self.hosts = HostsService(self.settings, self.poller, parent, selections=self.host_selections,
                                      agent=lambda: self.ensure_agent(parent))
            self._check_hosts_health()
        return self.hosts

    def _host_hl_smi(self, name: str) -> str:
        """A saved host's hl-smi path ("" where none is saved: its PATH)."""
        saved = self.hosts.saved() if self.hosts is not None else []
        return next((h.hl_smi for h in saved if h.name == name), "")

    def ensure_health(self, parent: QObject | None = None) -> HealthService:
        """The health service (doctor reports and alerts, watching the local poller) and the notifier
        of its alerts and of ended runs; nothing runs until ``health.start()``."""
        if self.health is None:
            from gaudi_gui.services.health import HealthService
            from gaudi_gui.services.notifier import Notifier
            self.health = HealthService(self.settings, parent)
            self.health.host_hl_smi = self._host_hl_smi
            self.health.watch_poller("local", self.poller)
            self.notifier = Notifier(self.settings, parent)
            self.notifier.watch_health(self.health)
            if self.training is not None:
                self.notifier.watch_training(self.training)
            if self.queue is not None:
                self.notifier.watch_queue(self.queue)
            self._check_hosts_health()
        return self.health

    def _check_hosts_health(self) -> None:
        """Once both exist: a host connected to (its poller made) is checked by the doctor too, and
        its samples feed the alerts."""
        hosts, health = self.hosts, self.health
        if hosts is None or health is None:
            return

        def watch(name: str, poller: QObject) -> None:
            health.watch_poller(name, poller)
            health.watch_host(name)

        hosts.poller_added.connect(watch)
        for name, poller in hosts.pollers.items():
            watch(name, poller)

    def ensure_agent(self, parent: QObject | None = None) -> AgentClient:
        """The agent's client, connecting (an agent is started in the background when none answers)."""
        if self.agent is None:
            # The one the agent's children (services/agent_child.py) speak through too.
            from gaudi_gui.services.agent_child import shared_client
            self.agent = shared_client()
            from gaudi_gui.services.jobs import AgentJobs
            # The agent's running jobs are the close dialog's too (the command line's among them).
            self.jobs.register(AgentJobs(self.agent, parent, registry=self.jobs))
        return self.agent

    def ensure_generation(self, parent: QObject | None = None) -> GenerationClient:
        """The model runner's client (its worker starts on the first load): the runner binds to it."""
        if self.generation is None:
            from gaudi_gui.services.generation_client import GenerationClient
            self.generation = GenerationClient(self.selection, parent=parent)
        return self.generation

    def ensure_remote_files(self, parent: QObject | None = None) -> RemoteFiles:
        """Listings of a host's folders (its agent's ``files.list``), for the Browse dialog."""
        if self.remote_files is None:
            from gaudi_gui.services.remote_files import RemoteFiles
            self.remote_files = RemoteFiles(self.ensure_agent(parent), parent)
        return self.remote_files

    def ensure_models(self, parent: QObject | None = None) -> ModelPlaces:
        """Downloads (jobs of the agent where the model goes) and cache listings (``gaudi-gui models``
        there); the close dialog lists its downloads."""
        if self.models is None:
            from gaudi_gui.services.downloads import ModelPlaces
            # Every download is a job of an agent (this machine's, or a host's through it).
            self.models = ModelPlaces(parent, agent=lambda: self.ensure_agent(parent))
            self.jobs.register(self.models)
        return self.models

    def ensure_preflight(self, parent: QObject | None = None) -> PreflightService:
        """The start gate's runner, made when a view first needs it (most starts never do: a machine
        without hl-smi and no host has nothing to check)."""
        if self.preflight is None:
            from gaudi_gui.services.preflight import PreflightService
            self.preflight = PreflightService(parent)
            self.preflight.host_hl_smi = self._host_hl_smi
        return self.preflight

    def ensure_schema(self, parent: QObject | None = None) -> SchemaLoader:
        """The TrainingArguments schema and validation children (one for the window): the Training
        tab binds to it; it never starts them itself."""
        if self.schema is None:
            from gaudi_gui.services.schema import SchemaLoader
            self.schema = SchemaLoader(parent)
        return self.schema

    def ensure_training(self, parent: QObject | None = None) -> TrainingService:
        """The training supervisor, made on first use: the app makes it after its first paint (its
        modules are a good part of what the window would otherwise wait for), or a view that is
        built sooner asks for it here."""
        if self.training is None:
            from gaudi_gui.services.training import TrainingService
            self.training = TrainingService(self.settings, self.selection, self.environment, parent)
            self.jobs.register(self.training)
            if self.notifier is not None:
                self.notifier.watch_training(self.training)
        return self.training

    def ensure_queue(self, parent: QObject | None = None) -> QueueService:
        """This machine's queue (the agent's ``queue`` events), made and started on first use; its
        queued jobs' starts and ends are notified."""
        if self.queue is None:
            from gaudi_gui.services.queue import QueueService
            settings = self.settings
            self.queue = QueueService(self.ensure_agent(parent), parent,
                                      cpu_jobs=lambda: int(settings.get("queue/cpu_jobs")))
            if self.notifier is not None:
                self.notifier.watch_queue(self.queue)
            self.queue.start()
        return self.queue

    def ensure_host_queue(self, name: str, parent: QObject | None = None) -> HostQueueService:
        """The queue of the saved host ``name`` (its remote command as saved), made and started on
        first use; ``stop_host_queues`` ends them all."""
        if name not in self.host_queues:
            from gaudi_gui.core.remote import find_host
            from gaudi_gui.services.queue import HostQueueService
            self.host_queues[name] = HostQueueService(find_host(name), self.ensure_agent(parent),
                                                      parent or self.settings.parent())
        service = self.host_queues[name]
        if not service.is_running():
            service.start()
        return service

    def queue_for(self, place: str, parent: QObject | None = None) -> JobQueue:
        """The one way a view queues a job at ``place`` ("local" or a saved host's name: the host's own
        queue add checks it), one face for both (``JobQueue``: ``add``/``add_kind``, ``shown``)."""
        if place == "local":
            return self.ensure_queue(parent or self.settings.parent())
        return self.ensure_host_queue(place, parent or self.settings.parent())

    def stop_host_queues(self) -> None:
        for service in self.host_queues.values():
            service.shutdown()

    def ensure_serve(self, parent: QObject | None = None) -> ServeService:
        """The Serve panel's service, made on first use."""
        if self.serve is None:
            from gaudi_gui.services.serve import ServeService
            self.serve = ServeService(parent)
            self.serve.settings = self.settings
            self.jobs.register(self.serve)
        return self.serve

    def ensure_evaluation(self, parent: QObject | None = None) -> EvaluationService:
        """The Evaluate job's service, made on first use (a view reached from Runs binds to it)."""
        if self.evaluation is None:
            from gaudi_gui.services.evaluation import EvaluationService
            self.evaluation = EvaluationService(parent)
            self.evaluation.settings = self.settings
            self.jobs.register(self.evaluation)
        return self.evaluation
