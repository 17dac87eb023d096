"""Paddle's dataset names beyond fleetfeed's own API, as real Paddle code calls them.

The ``_set_*`` setters of Paddle 2.x/3.x ``DatasetBase`` and ``InMemoryDataset``,
the public setters of the older ``fluid.dataset`` classes, and the attributes
Paddle scripts assign directly (``dataset.thread_num = 0``). Each maps onto a
fleetfeed setting through ``update_settings``, so datafeed/config/settings.py stays the
one place that validates a value. What exists only inside Paddle's
C++ (the GPU parameter server, BoxPS, pslib, the GPU graph engine, TDM
sampling) raises ``NotImplementedError`` saying what to use instead; a setter
that only switches such a feature off is accepted. docs/porting_from_paddle.md
has the table of every name.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from ..config.errors import SchemaError
from ..config.slots import SlotSchema

# feature -> (what it needs, what to do instead)
_ONLY_IN_PADDLE = {
    "psgpu": (
        "Paddle's GPU parameter server (PSGPU / HeterPS)",
        "train with trainer.fleet's parameter server (fleet.init() with a "
        "DistributedStrategy) or a collective job (fleet.init(is_collective=True)) "
        "and Executor('cuda')",
    ),
    "boxps": (
        "Paddle's BoxPS (pv merging, log keys, training phases)",
        "group the records of one page view in the reader (one record per pv) "
        "and use InMemoryDataset",
    ),
    "pslib": (
        "Paddle's pslib parameter server (local tables of unique feature ids)",
        "use trainer.fleet's parameter server, whose sparse tables "
        "(trainer.nn.SparseEmbedding) are created on first use",
    ),
    "graph": (
        "Paddle's GPU graph engine",
        "write the walks or samples as MultiSlot text in a reader and load them "
        "with InMemoryDataset",
    ),
    "tdm": (
        "Paddle's TDM tree sampler",
        "sample the tree's nodes in the reader (a MultiSlotDataGenerator)",
    ),
    "so_parser": (
        "a C++ parser library loaded into Paddle",
        "parse in a pipe_command or a data_generator (datafeed.source.inprocess)",
    ),
}


def _only_in_paddle(name: str, feature: str, off: Any = ...) -> Callable[..., Any]:
    """A method that raises ``NotImplementedError`` for ``feature``; with ``off``,
    a call whose first argument equals it (the feature switched off) is a no-op."""
    what, instead = _ONLY_IN_PADDLE[feature]
    message = f"{name}() needs {what}, which exists only inside Paddle's C++; instead, {instead}"

    def method(self: Any, *args: Any, **kwargs: Any) -> None:
        if off is not ... and args and not kwargs and args[0] == off:
            return
        raise NotImplementedError(message)

    method.__name__ = method.__qualname__ = name
    accepted = "" if off is ... else f" (``{name}({off!r})`` is accepted)"
    method.__doc__ = f"Not supported{accepted}: ``NotImplementedError``; needs {what}."
    return method


def _setting_property(setting: str, doc: str) -> property:
    """A read-write attribute (Paddle's plain attribute) backed by a setting."""

    def get(self: Any) -> Any:
        return self._settings[setting]

    def put(self: Any, value: Any) -> None:
        self.update_settings(**{setting: value})

    return property(get, put, doc=doc)


def _paddle_object(name: str, what: str, instead: str) -> property:
    """An attribute that holds one of Paddle's C++ objects there: reading it
    raises ``NotImplementedError`` saying what to use instead."""

    def get(self: Any) -> Any:
        raise NotImplementedError(
            f"dataset.{name} is Paddle's C++ {what}, which fleetfeed does not have; {instead}"
        )

    return property(get, doc=f"Paddle's C++ {what}: ``NotImplementedError`` ({instead}).")


class PaddleDatasetBase:
    """Paddle's ``DatasetBase`` setters and attributes, for ``DatasetBase``."""

    # Paddle's executor reads it; only False is possible here (_set_use_ps_gpu).
    use_ps_gpu = False
    # Paddle's PSGPU handle: None unless use_ps_gpu, which is never the case here.
    psgpu = None
    proto_desc = _paddle_object(
        "proto_desc", "DataFeedDesc protobuf",
        "read the settings from dataset.desc() or the dataset's own attributes",
    )
    dataset = _paddle_object(
        "dataset", "core.Dataset",
        "call the methods on the dataset itself (load_into_memory, global_shuffle, ...)",
    )

    _settings: Any
    update_settings: Callable[..., None]
    set_filelist: Callable[[Iterable[str]], None]
    get_filelist: Callable[[], list[str]]

    @property
    def filelist(self) -> list[str]:
        """The input files (Paddle's attribute; assigning it calls ``set_filelist``)."""
        return self.get_filelist()

    @filelist.setter
    def filelist(self, files: Iterable[str]) -> None:
        self.set_filelist(files)

    # -- Paddle 2.x / 3.x private setters (called by init, and by real code) -----------

    def _set_batch_size(self, batch_size: int) -> None:
        self.update_settings(batch_size=batch_size)

    def _set_thread(self, thread_num: int) -> None:
        self.update_settings(thread_num=thread_num)

    def _set_pipe_command(self, pipe_command: str) -> None:
        self.update_settings(pipe_command=pipe_command)

    def _set_use_var(self, var_list: Iterable[Any]) -> None:
        # Paddle's _set_use_var adds slots after those declared (init declares
        # them on an empty dataset); set_use_var / update_settings replace them.
        self.update_settings(use_var=[*self._settings["use_var"], *var_list])

    def _set_input_type(self, input_type: int) -> None:
        self.update_settings(input_type=input_type)

    def _set_hdfs_config(self, fs_name: str, fs_ugi: str) -> None:
        self.update_settings(fs_name=fs_name, fs_ugi=fs_ugi)

    def _set_download_cmd(self, download_cmd: str) -> None:
        self.update_settings(download_cmd=download_cmd)

    def _set_uid_slot(self, uid_slot: str) -> None:
        # Paddle: the slot whose value routes records in a shuffle by uid
        # (_set_shuffle_by_uid). Kept for that; the slot need not be declared yet.
        if not isinstance(uid_slot, str):
            raise SchemaError(f"_set_uid_slot() takes a slot name, got {uid_slot!r}")
        self._uid_slot = uid_slot

    def _set_use_ps_gpu(self, use_ps_gpu: Any) -> None:
        if use_ps_gpu:
            raise NotImplementedError(
                f"_set_use_ps_gpu({use_ps_gpu!r}) needs {_ONLY_IN_PADDLE['psgpu'][0]}, "
                f"which exists only inside Paddle's C++; call _set_use_ps_gpu(False) or "
                f"leave it out, and instead {_ONLY_IN_PADDLE['psgpu'][1]}"
            )
        self.use_ps_gpu = False

    # Paddle's executor calls these around a pass; fleetfeed prepares its readers
    # on each load or pass, so there is nothing to do.
    def _prepare_to_run(self) -> None:
        pass

    def _finish_to_run(self) -> None:
        pass

    def _dynamic_adjust_before_train(self, thread_num: int) -> None:
        pass

    def _dynamic_adjust_after_train(self) -> None:
        pass

    def _desc(self) -> str:
        """The settings as Paddle's ``DataFeedDesc`` text (its field names)."""
        s = self._settings.as_dict()
        lines = [
            f'name: "{s.get("data_feed_type", "MultiSlotDataFeed")}"',
            f"batch_size: {s['batch_size']}",
            "multi_slot_desc {",
        ]
        for slot in s["use_var"]:
            lines += [
                "  slots {",
                f'    name: "{slot.name}"',
                f'    type: "{"float" if slot.dtype == "float32" else "uint64"}"',
                f"    is_dense: {str(slot.is_dense).lower()}",
                "    is_used: true",
                *(f"    shape: {d}" for d in (slot.shape or ())),
                "  }",
            ]
        uid_slot = getattr(self, "_uid_slot", None)
        if uid_slot is not None:
            lines.append(f'  uid_slot: "{uid_slot}"')
        lines += ["}", f'pipe_command: "{s["pipe_command"]}"', f"input_type: {s['input_type']}"]
        return "\n".join(lines) + "\n"

    def _check_use_var_with_data_generator(
        self, var_list: Iterable[Any], data_generator_class: Any, test_file: str
    ) -> None:
        """Paddle's check of a generator's output against ``var_list`` on a local file:
        as many slots as variables, none empty, floats for float32 and ints else."""
        slots = SlotSchema(var_list)
        with open(test_file) as lines:
            for number, line in enumerate(lines, start=1):
                for record in data_generator_class.generate_sample(line)():
                    where = f"{test_file}:{number}"
                    if len(record) != len(slots):
                        raise ValueError(
                            f"var length mismatch error: var_list = {len(slots)} vs "
                            f"data_generator = {len(record)} ({where})"
                        )
                    for slot, (name, values) in zip(slots, record, strict=True):
                        _check_generated_values(slot, name, values, where)

    # -- fluid 1.x / 2.x public setters ------------------------------------------------

    def set_hdfs_config(self, fs_name: str, fs_ugi: str) -> None:
        """fluid's setter: ``update_settings(fs_name=..., fs_ugi=...)``."""
        self._set_hdfs_config(fs_name, fs_ugi)

    def set_download_cmd(self, download_cmd: str) -> None:
        """fluid's setter: ``update_settings(download_cmd=...)``."""
        self._set_download_cmd(download_cmd)

    def set_input_type(self, input_type: int) -> None:
        """fluid's setter: ``update_settings(input_type=...)``."""
        self._set_input_type(input_type)

    def desc(self) -> str:
        """fluid's name: the settings as Paddle's ``DataFeedDesc`` text."""
        return self._desc()

    set_so_parser_name = _only_in_paddle("set_so_parser_name", "so_parser")
    set_rank_offset = _only_in_paddle("set_rank_offset", "boxps", off="")
    set_pv_batch_size = _only_in_paddle("set_pv_batch_size", "boxps", off=1)
    set_graph_config = _only_in_paddle("set_graph_config", "graph")
    set_pass_id = _only_in_paddle("set_pass_id", "graph")
    get_pass_id = _only_in_paddle("get_pass_id", "graph")
    get_epoch_finish = _only_in_paddle("get_epoch_finish", "graph")
    clear_sample_state = _only_in_paddle("clear_sample_state", "graph")
    dump_walk_path = _only_in_paddle("dump_walk_path", "graph")
    dump_sample_neighbors = _only_in_paddle("dump_sample_neighbors", "graph")
    _set_heter_ps = _only_in_paddle("_set_heter_ps", "psgpu", off=False)


def _check_generated_values(slot: Any, name: str, values: Any, where: str) -> None:
    if len(values) == 0:
        raise ValueError(f"var length error: var {name}'s length in data_generator is 0 ({where})")
    if slot.dtype == "float32":
        expected, kind = float, "float"
    else:
        expected, kind = int, "int"
    if not all(isinstance(v, expected) and not isinstance(v, bool) for v in values):
        raise TypeError(
            f"var dtype mismatch error: var name = {name}, var type in var_list = {kind}, "
            f"while var in data_generator contains non-{kind} value, which is {values} "
            f"({where}); check that var_list and the generator list the slots in one order"
        )


class PaddleInMemoryDataset:
    """Paddle's ``InMemoryDataset`` setters and attributes, for ``InMemoryDataset``."""

    _settings: Any
    update_settings: Callable[..., None]

    # Paddle's plain attributes with its defaults: read by some drivers, and
    # only meaningful to BoxPS (log keys, pv merging) or to fluid's shuffle.
    is_user_set_queue_num = False
    parse_logkey = False
    merge_by_sid = True
    enable_pv_merge = False
    trainer_num = -1

    fleet_send_batch_size = _setting_property(
        "fleet_send_batch_size", "Records per destination per global-shuffle round."
    )
    fleet_send_sleep_seconds = _setting_property(
        "fleet_send_sleep_seconds",
        "Paddle's pause between global-shuffle rounds: stored, not used here (the "
        "rounds go over torch.distributed, with no server to throttle).",
    )
    queue_num = _setting_property(
        "queue_num", "Paddle's output queue count: stored, not used (one store feeds all)."
    )
    parse_ins_id = _setting_property("parse_ins_id", "Whether lines start with an instance id.")
    parse_content = _setting_property("parse_content", "Whether lines carry a content field.")
    fea_eval = _setting_property(
        "fea_eval", "Paddle's switch for slots_shuffle: stored; slots_shuffle works regardless."
    )
    candidate_size = _setting_property(
        "candidate_size",
        "Paddle's slots_shuffle reservoir size: stored; slots_shuffle draws from every record.",
    )

    merge_by_lineid = _setting_property(
        "merge_by_lineid",
        "Whether global_shuffle() then merges the records of one instance id "
        "(``_set_merge_by_lineid``; datafeed/reorder/merge.py).",
    )

    def _init_distributed_settings(
        self,
        *,
        merge_size: int = -1,
        parse_ins_id: bool = False,
        parse_content: bool = False,
        fleet_send_batch_size: int | None = None,
        fleet_send_sleep_seconds: float | None = None,
        fea_eval: bool = False,
        candidate_size: int = 10000,
    ) -> None:
        # Paddle's rules: merge_size only when > 0 (it also turns parse_ins_id
        # on), the send settings only when truthy, candidate_size only with fea_eval.
        settings: dict[str, Any] = {}
        if isinstance(merge_size, int) and merge_size > 0:
            settings.update(merge_size=merge_size, parse_ins_id=True)
        settings.setdefault("parse_ins_id", parse_ins_id)
        settings["parse_content"] = parse_content
        if fleet_send_batch_size:
            settings["fleet_send_batch_size"] = fleet_send_batch_size
        if fleet_send_sleep_seconds:
            settings["fleet_send_sleep_seconds"] = fleet_send_sleep_seconds
        if fea_eval:
            settings.update(fea_eval=True, candidate_size=candidate_size)
        self.update_settings(**settings)

    def _set_feed_type(self, data_feed_type: str) -> None:
        self.update_settings(data_feed_type=data_feed_type)

    def _set_queue_num(self, queue_num: int) -> None:
        self.update_settings(queue_num=queue_num)
        self.is_user_set_queue_num = True

    def _set_parse_ins_id(self, parse_ins_id: bool) -> None:
        self.update_settings(parse_ins_id=parse_ins_id)

    def _set_parse_content(self, parse_content: bool) -> None:
        self.update_settings(parse_content=parse_content)

    def _set_fleet_send_batch_size(self, fleet_send_batch_size: int = 1024) -> None:
        self.update_settings(fleet_send_batch_size=fleet_send_batch_size)

    def _set_fleet_send_sleep_seconds(self, fleet_send_sleep_seconds: float = 0) -> None:
        self.update_settings(fleet_send_sleep_seconds=fleet_send_sleep_seconds)

    def _set_merge_by_lineid(self, merge_size: int = 2) -> None:
        self.update_settings(merge_size=merge_size, merge_by_lineid=True, parse_ins_id=True)

    def _set_fea_eval(self, record_candidate_size: int, fea_eval: bool = True) -> None:
        settings: dict[str, Any] = {"fea_eval": fea_eval}
        if fea_eval:
            settings["candidate_size"] = record_candidate_size
        self.update_settings(**settings)

    def _set_trainer_num(self, trainer_num: int) -> None:
        # fluid's worker count for global_shuffle; here it comes from the fleet
        # or the process group, so the value is kept for reading only.
        self.trainer_num = trainer_num

    def _set_shuffle_by_uid(self, enable_shuffle_uid: bool) -> None:
        # Paddle: global_shuffle sends each record to the worker its uid hashes
        # to (the uid slot of _set_uid_slot; merge by line id, when on, wins).
        if not isinstance(enable_shuffle_uid, bool):
            raise TypeError(
                f"_set_shuffle_by_uid() takes True or False, got {enable_shuffle_uid!r}"
            )
        self._shuffle_by_uid = enable_shuffle_uid

    def set_date(self, date: str) -> None:
        """Paddle's training date for the GPU parameter server: checked (``YYYYMMDD``)
        and otherwise a no-op, as in a Paddle build without PSGPU."""
        text = str(date)
        if len(text) != 8 or not text.isdigit():
            raise ValueError(f"set_date() takes a date as 'YYYYMMDD', got {date!r}")

    # fluid's public names of the setters above.
    def set_feed_type(self, data_feed_type: str) -> None:
        """fluid's setter: ``update_settings(data_feed_type=...)``."""
        self._set_feed_type(data_feed_type)

    def set_queue_num(self, queue_num: int) -> None:
        """fluid's setter: ``update_settings(queue_num=...)``."""
        self._set_queue_num(queue_num)

    def set_parse_ins_id(self, parse_ins_id: bool) -> None:
        """fluid's setter: ``update_settings(parse_ins_id=...)``."""
        self._set_parse_ins_id(parse_ins_id)

    def set_parse_content(self, parse_content: bool) -> None:
        """fluid's setter: ``update_settings(parse_content=...)``."""
        self._set_parse_content(parse_content)

    def set_fleet_send_batch_size(self, fleet_send_batch_size: int = 1024) -> None:
        """fluid's setter: ``update_settings(fleet_send_batch_size=...)``."""
        self._set_fleet_send_batch_size(fleet_send_batch_size)

    def set_fleet_send_sleep_seconds(self, fleet_send_sleep_seconds: float = 0) -> None:
        """fluid's setter: ``update_settings(fleet_send_sleep_seconds=...)``."""
        self._set_fleet_send_sleep_seconds(fleet_send_sleep_seconds)

    def set_merge_by_lineid(self, merge_size: int = 2) -> None:
        """fluid's setter: merge the records of one line id (``merge_size``)."""
        self._set_merge_by_lineid(merge_size)

    def set_fea_eval(self, record_candidate_size: int, fea_eval: bool = True) -> None:
        """fluid's setter: ``update_settings(fea_eval=..., candidate_size=...)``."""
        self._set_fea_eval(record_candidate_size, fea_eval)

    def set_merge_by_sid(self, merge_by_sid: bool) -> None:
        """fluid's BoxPS pv setting: kept in ``merge_by_sid`` and otherwise unused
        (it only matters with ``set_enable_pv_merge(True)``, which is not supported)."""
        self.merge_by_sid = merge_by_sid

    _set_generate_unique_feasigns = _only_in_paddle("_set_generate_unique_feasigns", "pslib")
    set_generate_unique_feasigns = _only_in_paddle("set_generate_unique_feasigns", "pslib")
    _generate_local_tables_unlock = _only_in_paddle("_generate_local_tables_unlock", "pslib")
    generate_local_tables_unlock = _only_in_paddle("generate_local_tables_unlock", "pslib")
    tdm_sample = _only_in_paddle("tdm_sample", "tdm")
    set_parse_logkey = _only_in_paddle("set_parse_logkey", "boxps", off=False)
    set_enable_pv_merge = _only_in_paddle("set_enable_pv_merge", "boxps", off=False)
    set_current_phase = _only_in_paddle("set_current_phase", "boxps")
    preprocess_instance = _only_in_paddle("preprocess_instance", "boxps")
    postprocess_instance = _only_in_paddle("postprocess_instance", "boxps")
    get_pv_data_size = _only_in_paddle("get_pv_data_size", "boxps")
