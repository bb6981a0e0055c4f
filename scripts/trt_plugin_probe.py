"""Can a TensorRT plugin for the fused memory update be registered and built on this machine?

    python scripts/trt_plugin_probe.py            # tensorrt if it imports, else tensorrt_rtx
    python scripts/trt_plugin_probe.py tensorrt_rtx

Each probe runs in its own child process (one of them can abort the interpreter) and prints one
line: what was tried and what happened. The probes are the routes issue 4 names for the plugin:

1. `plugin-api`: TensorRT's Python plugin API (`<module>.plugin`: `register`, `impl`,
   `aot_impl`), the way to back a plugin with a Triton kernel from Python.
2. `network-add-plugin-v3`: `INetworkDefinition.add_plugin_v3`, to put an IPluginV3 layer into a
   network built in Python.
3. `onnx-custom-node`: an ONNX graph with one custom-domain node (`edgemem::EdgememMemoryWrite`)
   whose creator is a Python IPluginV3 in the plugin registry, parsed and built for SM89 (the
   route an exporter's custom-domain node takes).
4. `cpp-plugin-no-gpu`: a plugin creator compiled into the library (`ROIAlign_TRT`) through the
   same parser, to tell "Python plugins" apart from "any plugin without a GPU".

Result on the development machine (tensorrt_rtx 1.7.1, no GPU, 2026-11-30) in README.md, section
"GPU paths: built and tested up to the GPU boundary".
"""

from __future__ import annotations

import importlib
import subprocess
import sys

from edgemem.cli_common import run_script
from edgemem.errors import EdgememError

MODULES = ("tensorrt", "tensorrt_rtx")
PROBES = ("plugin-api", "network-add-plugin-v3", "onnx-custom-node", "cpp-plugin-no-gpu")


def _python_plugin(trt):  # type: ignore[no-untyped-def]
    """A minimal IPluginV3 (one float32 input, same shape out) and its creator, in Python."""

    class Plugin(trt.IPluginV3, trt.IPluginV3OneCore, trt.IPluginV3OneBuild, trt.IPluginV3OneRuntime):
        def __init__(self):  # type: ignore[no-untyped-def]
            for base in (trt.IPluginV3, trt.IPluginV3OneCore, trt.IPluginV3OneBuild, trt.IPluginV3OneRuntime):
                base.__init__(self)
            self.plugin_name, self.plugin_version, self.plugin_namespace = (
                "EdgememMemoryWrite",
                "1",
                "edgemem",
            )
            self.num_outputs = 1

        def get_capability_interface(self, kind):  # type: ignore[no-untyped-def]
            return self

        def get_output_data_types(self, input_types):  # type: ignore[no-untyped-def]
            return [input_types[0]]

        def get_output_shapes(self, inputs, shape_inputs, builder):  # type: ignore[no-untyped-def]
            return [inputs[0]]

        def supports_format_combination(self, pos, in_out, num_inputs):  # type: ignore[no-untyped-def]
            desc = in_out[pos].desc
            return desc.type == trt.float32 and desc.format == trt.TensorFormat.LINEAR

        def configure_plugin(self, inputs, outputs):  # type: ignore[no-untyped-def]
            pass

        def on_shape_change(self, inputs, outputs):  # type: ignore[no-untyped-def]
            pass

        def get_fields_to_serialize(self):  # type: ignore[no-untyped-def]
            return trt.PluginFieldCollection([])

        def enqueue(self, *args):  # type: ignore[no-untyped-def]
            raise RuntimeError("not for running: a build probe")

        def attach_to_context(self, context):  # type: ignore[no-untyped-def]
            return self.clone()

        def set_tactic(self, tactic):  # type: ignore[no-untyped-def]
            pass

        def clone(self):  # type: ignore[no-untyped-def]
            return Plugin()

        def get_valid_tactics(self):  # type: ignore[no-untyped-def]
            return []

        def get_workspace_size(self, inputs, outputs):  # type: ignore[no-untyped-def]
            return 0

    class Creator(trt.IPluginCreatorV3One):
        def __init__(self):  # type: ignore[no-untyped-def]
            trt.IPluginCreatorV3One.__init__(self)
            self.name, self.plugin_namespace, self.plugin_version = "EdgememMemoryWrite", "edgemem", "1"
            self.field_names = trt.PluginFieldCollection([])

        def create_plugin(self, name, fields, phase):  # type: ignore[no-untyped-def]
            return Plugin()

    return Creator()


def _parse_and_build(trt, model) -> str:  # type: ignore[no-untyped-def]
    logger = trt.Logger(trt.Logger.ERROR)
    builder = trt.Builder(logger)
    network = builder.create_network(0)
    parser = trt.OnnxParser(network, logger)
    if not parser.parse(model.SerializeToString()):
        return "parse failed: " + "; ".join(str(parser.get_error(i)) for i in range(parser.num_errors))[:300]
    config = builder.create_builder_config()
    if hasattr(trt, "ComputeCapability"):
        config.num_compute_capabilities = 1
        config.set_compute_capability(trt.ComputeCapability.SM89, 0)
    plan = builder.build_serialized_network(network, config)
    return "built a plan" if plan is not None else "build returned no plan"


def probe(name: str, module: str) -> str:
    import onnx
    import onnx.helper as h

    trt = importlib.import_module(module)
    if name == "plugin-api":
        plugin = importlib.import_module(f"{module}.plugin")
        return "available: " + ", ".join(n for n in ("register", "impl", "aot_impl") if hasattr(plugin, n))
    if name == "network-add-plugin-v3":
        return "available" if hasattr(trt.INetworkDefinition, "add_plugin_v3") else "no such method"
    F = onnx.TensorProto.FLOAT
    if name == "onnx-custom-node":
        registry = trt.get_plugin_registry()
        creator = _python_plugin(trt)
        if not registry.register_creator(creator, "edgemem"):
            return "the registry refused the Python creator"
        node = h.make_node(
            "EdgememMemoryWrite",
            ["x"],
            ["y"],
            domain="edgemem",
            plugin_namespace="edgemem",
            plugin_version="1",
        )
        io = [h.make_tensor_value_info(n, F, [1, 8]) for n in ("x", "y")]
        graph = h.make_graph([node], "g", io[:1], io[1:])
        model = h.make_model(graph, opset_imports=[h.make_opsetid("", 18), h.make_opsetid("edgemem", 1)])
        return _parse_and_build(trt, model)
    if name == "cpp-plugin-no-gpu":
        node = h.make_node(
            "ROIAlign_TRT", ["x", "rois", "idx"], ["y"], domain="trt", plugin_version="2",
            plugin_namespace="", output_height=2, output_width=2, sampling_ratio=1, spatial_scale=1.0, mode=1,
            coordinate_transformation_mode=1,
        )  # fmt: skip
        inputs = [
            h.make_tensor_value_info("x", F, [1, 2, 8, 8]),
            h.make_tensor_value_info("rois", F, [3, 4]),
            h.make_tensor_value_info("idx", onnx.TensorProto.INT32, [3]),
        ]
        graph = h.make_graph([node], "g", inputs, [h.make_tensor_value_info("y", F, [3, 2, 2, 2])])
        model = h.make_model(graph, opset_imports=[h.make_opsetid("", 18), h.make_opsetid("trt", 1)])
        return _parse_and_build(trt, model)
    raise ValueError(name)


def main() -> None:
    if len(sys.argv) == 3:  # child: one probe
        try:
            print(probe(sys.argv[1], sys.argv[2]), flush=True)
        except Exception as exc:  # noqa: BLE001 - the probe reports whatever stops it
            print(f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}", flush=True)
        return
    if len(sys.argv) > 2:
        raise EdgememError("usage: python scripts/trt_plugin_probe.py [tensorrt|tensorrt_rtx]")
    module = sys.argv[1] if len(sys.argv) > 1 else None
    if module is not None and module not in MODULES:
        raise EdgememError(f"unknown module {module!r}: use {' or '.join(MODULES)}")
    for candidate in MODULES if module is None else (module,):
        try:
            importlib.import_module(candidate)
        except ImportError:
            continue
        module = candidate
        break
    else:
        named = f"{module} does not import" if module else "no TensorRT module imports"
        raise EdgememError(f"{named} (pip install tensorrt-rtx-cu13)")
    version = importlib.import_module(module).__version__
    print(f"{module} {version}")
    for name in PROBES:
        proc = subprocess.run(
            [sys.executable, __file__, name, module], capture_output=True, text=True, timeout=600
        )
        lines = proc.stdout.strip().splitlines()
        if proc.returncode < 0:
            last = (proc.stderr.strip().splitlines() or ["?"])[-1]
            outcome = f"the process died (signal {-proc.returncode}; last stderr line: {last[:160]})"
        else:
            outcome = lines[-1] if lines else f"no output (exit {proc.returncode})"
        cuda = [line for line in (proc.stdout + proc.stderr).splitlines() if "CUDA" in line]
        if cuda:
            outcome += f" [TensorRT logged: {cuda[0].split('] ')[-1][:120]}]"
        print(f"{name}: {outcome}")


if __name__ == "__main__":
    run_script(main)
