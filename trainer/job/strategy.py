"""``DistributedStrategy``: how a fleet job trains (sync, async or GEO parameter server).

It keeps Paddle's attribute names and defaults (reference §5.2): ``a_sync`` is
True by default and setting it resets ``a_sync_configs["k_steps"]`` to 0;
``a_sync_configs`` takes the keys of Paddle's ``AsyncConfig``. Unlike Paddle, an
unknown key is a ``KeyError`` that lists the known ones (Paddle asserts), and an
untouched ``k_steps`` (-1, where Paddle's parameter-server optimizer silently does
not apply) reads as 0, so the default strategy means async.

``StrategyFactory`` is Paddle 1.x's way to the same three modes
(``paddle.fluid.incubate.fleet.parameter_server.distribute_transpiler.
distributed_strategy``), still what PaddleRec's distributed guide calls: its
``create_*_strategy()`` return a ``DistributedStrategy`` set for that mode.
"""

from __future__ import annotations

from typing import Any

from .errors import TrainerError

__all__ = [
    "MODES", "PULL_AHEAD_MAX", "DistributedStrategy", "StrategyFactory", "async_settings",
    "parameter_server_mode",
]

# The parameter-server modes, as ``DistributedStrategy.mode`` names them.
MODES = ("async", "sync", "geo")
# The deepest an async worker sends its pulls ahead (trainer.embedding.ahead.MAX_DEPTH).
PULL_AHEAD_MAX = 16
# Paddle's AsyncConfig (distributed_strategy.proto) with its defaults.
_A_SYNC_DEFAULTS: dict[str, Any] = {
    "k_steps": -1,
    "max_merge_var_num": 1,
    "send_queue_size": 16,
    "independent_recv_thread": False,
    "min_send_grad_num_before_recv": 1,
    "thread_pool_size": 1,
    "send_wait_times": 1,
    "runtime_split_send_recv": False,
    "launch_barrier": True,
    # fleetfeed's own: batches whose pulls an async worker sends ahead of their
    # forwards (trainer/embedding/ahead.py). -1: as many as the measured round
    # trip needs; 0: none (each forward waits for its pull); n: n batches.
    "pull_ahead": -1,
    # fleetfeed's own: the most pushes a training thread keeps in flight while
    # its pulls go ahead (at most send_queue_size). Each one more lets the
    # worker's dense parameters lag a step more: 16 workers of the small CTR
    # model on one server trained as well with 1-3 as without pulls ahead, and
    # far worse with 16 (benchmarks/results/ps_push_bound.md).
    "pushes_in_flight": 2,
}

_ATTRIBUTES = ("a_sync", "a_sync_configs", "find_unused_parameters", "trainer_desc_configs")
# Paddle's TrainerDescConfig keys that fleetfeed carries out (trainer/loop/dumps.py).
_TRAINER_DESC_DEFAULTS: dict[str, Any] = {
    "dump_fields_path": "",
    "dump_fields": [],
    "dump_param": [],
}


class DistributedStrategy:
    """Training options of a fleet job.

    Attributes:
        a_sync: False for synchronous parameter-server training (every worker's
            step applied together), True for asynchronous or GEO. Setting it
            resets ``a_sync_configs["k_steps"]`` to 0, as Paddle does.
        a_sync_configs: Paddle's ``AsyncConfig`` as a dict. Assigning a dict
            updates only the keys it holds; ``k_steps > 0`` with ``a_sync=True``
            selects GEO (workers train locally and push deltas every k steps).
        find_unused_parameters: passed to ``DistributedDataParallel`` in
            collective mode (Paddle's attribute of the same name).
        trainer_desc_configs: Paddle's per-instance dumps: ``dump_fields_path``
            (a folder), ``dump_fields`` (model outputs written per instance) and
            ``dump_param`` (parameters written per batch); see
            trainer/loop/dumps.py. Assigning a dict updates only its keys.

    Raises:
        TypeError: on setting an attribute the strategy does not have (Paddle's
            behaviour), or a value of the wrong type.
        KeyError: on an unknown ``a_sync_configs`` key.
    """

    _a_sync: bool
    _a_sync_configs: dict[str, Any]
    _find_unused_parameters: bool
    _trainer_desc_configs: dict[str, Any]

    def __init__(self) -> None:
        object.__setattr__(self, "_a_sync", True)
        object.__setattr__(self, "_a_sync_configs", dict(_A_SYNC_DEFAULTS))
        object.__setattr__(self, "_find_unused_parameters", False)
        defaults = {k: list(v) if isinstance(v, list) else v
                    for k, v in _TRAINER_DESC_DEFAULTS.items()}
        object.__setattr__(self, "_trainer_desc_configs", defaults)

    def __setattr__(self, name: str, value: Any) -> None:
        if name not in _ATTRIBUTES:
            raise TypeError(
                f"{name} is not an attribute of DistributedStrategy; "
                f"fleetfeed supports {', '.join(_ATTRIBUTES)}"
            )
        object.__setattr__(self, name, value)

    # -- a_sync --------------------------------------------------------------------

    @property
    def a_sync(self) -> bool:
        """True (the default): asynchronous training, or GEO when ``k_steps > 0``;
        False: synchronous."""
        return self._a_sync

    @a_sync.setter
    def a_sync(self, flag: bool) -> None:
        if not isinstance(flag, bool):
            raise TypeError(
                f"DistributedStrategy.a_sync must be a bool, got {flag!r} "
                f"({type(flag).__name__})"
            )
        object.__setattr__(self, "_a_sync", flag)
        self._a_sync_configs["k_steps"] = 0  # Paddle's setter does the same

    @property
    def a_sync_configs(self) -> dict[str, Any]:
        """A copy of the current configuration (assign a dict to change it)."""
        return dict(self._a_sync_configs)

    @a_sync_configs.setter
    def a_sync_configs(self, configs: dict[str, Any]) -> None:
        if not isinstance(configs, dict):
            raise TypeError(
                f"DistributedStrategy.a_sync_configs must be a dict, got "
                f"{type(configs).__name__}"
            )
        for key, value in configs.items():
            if key not in _A_SYNC_DEFAULTS:
                raise KeyError(
                    f"{key!r} is not a key of a_sync_configs; the keys are "
                    f"{', '.join(sorted(_A_SYNC_DEFAULTS))}"
                )
            expected = type(_A_SYNC_DEFAULTS[key])
            if type(value) is not expected:
                raise TypeError(
                    f"a_sync_configs[{key!r}] must be {expected.__name__}, got "
                    f"{value!r} ({type(value).__name__})"
                )
            if key == "k_steps" and value < -1:
                raise ValueError(
                    f"a_sync_configs['k_steps'] must be >= 0 (or -1, unset), got {value}"
                )
            if key == "pull_ahead" and not -1 <= value <= PULL_AHEAD_MAX:
                raise ValueError(
                    f"a_sync_configs['pull_ahead'] must be -1 (from the round trip), 0 (off) "
                    f"or a number of batches up to {PULL_AHEAD_MAX}, got {value}"
                )
            if key in ("send_queue_size", "pushes_in_flight") and value < 1:
                raise ValueError(f"a_sync_configs[{key!r}] must be >= 1, got {value}")
        self._a_sync_configs.update(configs)

    # -- find_unused_parameters ----------------------------------------------------

    @property
    def find_unused_parameters(self) -> bool:
        """Collective mode: ``DistributedDataParallel``'s option for models whose
        forward may leave some parameters unused."""
        return self._find_unused_parameters

    @find_unused_parameters.setter
    def find_unused_parameters(self, flag: bool) -> None:
        if not isinstance(flag, bool):
            raise TypeError(
                f"DistributedStrategy.find_unused_parameters must be a bool, "
                f"got {flag!r}"
            )
        object.__setattr__(self, "_find_unused_parameters", flag)

    # -- trainer_desc_configs --------------------------------------------------------

    @property
    def trainer_desc_configs(self) -> dict[str, Any]:
        """A copy of the dump settings (assign a dict to change them)."""
        return {k: list(v) if isinstance(v, list) else v
                for k, v in self._trainer_desc_configs.items()}

    @trainer_desc_configs.setter
    def trainer_desc_configs(self, configs: dict[str, Any]) -> None:
        if not isinstance(configs, dict):
            raise TypeError(
                f"DistributedStrategy.trainer_desc_configs must be a dict, got "
                f"{type(configs).__name__}"
            )
        checked = {}
        for key, value in configs.items():
            if key not in _TRAINER_DESC_DEFAULTS:
                raise KeyError(
                    f"{key!r} is not a trainer_desc_configs key fleetfeed carries out; the "
                    f"keys are {', '.join(sorted(_TRAINER_DESC_DEFAULTS))}"
                )
            if key == "dump_fields_path":
                if not isinstance(value, str):
                    raise TypeError(
                        f"trainer_desc_configs['dump_fields_path'] must be a folder path "
                        f"(str), got {value!r}"
                    )
                checked[key] = value
            else:
                if not isinstance(value, (list, tuple)) or not all(
                    isinstance(name, str) and name for name in value
                ):
                    raise TypeError(
                        f"trainer_desc_configs[{key!r}] must be a list of names, got {value!r}"
                    )
                checked[key] = list(value)
        self._trainer_desc_configs.update(checked)

    # -- derived -------------------------------------------------------------------

    @property
    def k_steps(self) -> int:
        """``a_sync_configs["k_steps"]``, with the untouched default -1 read as 0."""
        return max(self._a_sync_configs["k_steps"], 0)

    @property
    def mode(self) -> str:
        """The parameter-server mode: ``"sync"``, ``"async"`` or ``"geo"``.

        Paddle's rule: ``a_sync=False, k_steps=0`` is sync; ``a_sync=True,
        k_steps=0`` async; ``a_sync=True, k_steps>0`` GEO.

        Raises:
            ValueError: for ``a_sync=False`` with ``k_steps > 0`` (Paddle raises
                too: GEO is asynchronous by definition).
        """
        k_steps = self.k_steps
        if not self._a_sync and k_steps > 0:
            raise ValueError(
                f"a_sync=False (sync) cannot be combined with a_sync_configs"
                f"['k_steps']={k_steps} (GEO); set a_sync=True for GEO or k_steps=0 "
                f"for sync"
            )
        return _paddle_mode(self._a_sync, k_steps)

    def __repr__(self) -> str:
        return (
            f"DistributedStrategy(a_sync={self._a_sync}, "
            f"a_sync_configs={self._a_sync_configs}, "
            f"find_unused_parameters={self._find_unused_parameters}, "
            f"trainer_desc_configs={self._trainer_desc_configs})"
        )


class StrategyFactory:
    """Paddle 1.x's ``StrategyFactory``: a ``DistributedStrategy`` per mode.

    ``fleet.distributed_optimizer(optimizer, StrategyFactory.create_sync_strategy())``
    trains as Paddle's ``SyncStrategy`` does; the same for async and GEO.
    """

    @staticmethod
    def create_sync_strategy() -> DistributedStrategy:
        """Synchronous training: ``a_sync=False`` (``k_steps`` 0)."""
        strategy = DistributedStrategy()
        strategy.a_sync = False
        return strategy

    @staticmethod
    def create_async_strategy() -> DistributedStrategy:
        """Asynchronous training: ``a_sync=True``, ``k_steps`` 0."""
        strategy = DistributedStrategy()
        strategy.a_sync = True
        return strategy

    @staticmethod
    def create_geo_strategy(update_frequency: int = 100) -> DistributedStrategy:
        """GEO: workers train locally and push their deltas every
        ``update_frequency`` steps (``a_sync=True``, ``k_steps=update_frequency``;
        Paddle's default 100).

        Raises:
            TypeError: ``update_frequency`` is not an int.
            ValueError: ``update_frequency`` is below 1.
        """
        if isinstance(update_frequency, bool) or not isinstance(update_frequency, int):
            raise TypeError(
                f"StrategyFactory.create_geo_strategy(update_frequency) takes the steps "
                f"between two pushes as an int >= 1, got {update_frequency!r} "
                f"({type(update_frequency).__name__})"
            )
        if update_frequency < 1:
            raise ValueError(
                f"StrategyFactory.create_geo_strategy(update_frequency) takes the steps "
                f"between two pushes as an int >= 1, got {update_frequency}"
            )
        strategy = StrategyFactory.create_async_strategy()
        strategy.a_sync_configs = {"k_steps": update_frequency}
        return strategy

    @staticmethod
    def create_half_async_strategy() -> DistributedStrategy:
        """Paddle 1.x's half-async mode, which fleetfeed does not have.

        Raises:
            NotImplementedError: always, naming the modes there are.
        """
        raise NotImplementedError(
            "StrategyFactory.create_half_async_strategy(): Paddle 1.x's half-async "
            "communicator is not a fleetfeed mode; use create_sync_strategy() (every "
            "worker's step applied together) or create_async_strategy()"
        )


def _paddle_mode(a_sync: bool, k_steps: int) -> str:
    """Paddle's rule from ``a_sync`` and ``k_steps`` (see ``DistributedStrategy.mode``)."""
    if not a_sync:
        return "sync"
    return "geo" if k_steps > 0 else "async"


def parameter_server_mode(strategy: Any) -> tuple[str, int]:
    """The mode and the GEO period a parameter-server runtime trains with.

    Args:
        strategy: a ``DistributedStrategy`` (its ``mode``); None (async); or any
            object with Paddle's attributes: ``mode`` (or, without it, ``a_sync``,
            read with Paddle's rule) and ``a_sync_configs`` (a dict, read for
            ``k_steps``; missing or unreadable counts as 0).

    Returns:
        ``(mode, k_steps)``: ``mode`` lower-cased, one of ``MODES``; ``k_steps``
        as configured (-1 or 0 where unset; >= 1 in GEO mode).

    Raises:
        TrainerError: a mode outside ``MODES``, or GEO with ``k_steps < 1``.
        ValueError: a ``DistributedStrategy`` with ``a_sync=False`` and
            ``k_steps > 0`` (from its ``mode``).
    """
    if strategy is None:
        return "async", 0
    configs = getattr(strategy, "a_sync_configs", None) or {}
    try:
        k_steps = int(configs.get("k_steps") or 0)
    except (TypeError, ValueError, AttributeError):
        k_steps = 0
    mode = getattr(strategy, "mode", None)
    if mode is None:
        mode = _paddle_mode(getattr(strategy, "a_sync", True), k_steps)
    mode = str(mode).lower()
    if mode not in MODES:
        raise TrainerError(f"strategy.mode must be one of {MODES}, got {mode!r}")
    if mode == "geo" and k_steps < 1:
        raise TrainerError(f"GEO mode needs a_sync_configs['k_steps'] >= 1, got {k_steps}")
    return mode, k_steps


def async_settings(strategy: Any) -> tuple[int | None, int]:
    """Async mode's ``(pull_ahead, max_pushes)`` from a strategy's
    ``a_sync_configs``: ``pull_ahead`` None where it is -1 or unset (chosen
    from the round trip); ``max_pushes`` the lower of ``pushes_in_flight`` and
    ``send_queue_size``. The defaults where a strategy lacks them."""
    configs = getattr(strategy, "a_sync_configs", None) or {}
    if not isinstance(configs, dict):
        configs = {}
    values = {
        key: configs.get(key, _A_SYNC_DEFAULTS[key])
        for key in ("pull_ahead", "send_queue_size", "pushes_in_flight")
    }
    for key, value in values.items():
        if type(value) is not int:
            raise TrainerError(f"a_sync_configs[{key!r}] must be an int, got {value!r}")
    ahead = values["pull_ahead"]
    return (None if ahead == -1 else ahead), min(
        values["send_queue_size"], values["pushes_in_flight"]
    )
