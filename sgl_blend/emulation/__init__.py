"""An emulated GPU inside SGLang: the real server with only the model forward replaced by a priced one.

SGLang's tokenizer, scheduler (radix cache, chunked prefill, mixed batches, retraction, the
sgl-blend plugin) and detokenizer all run for real on this machine; the model forward computes
nothing and returns a fixed ordinary token, and a device clock advances by what the simulator's
cost model (`sgl_blend.forward_time.step_time.StepTime`) prices that forward's exact shapes at on the
emulated device. With ``--emulate cpu`` the real forward runs too and is timed beside its price.

- `config`: `EmulationConfig`, what the plugin is told (one field of `PluginSettings`);
- `devices`, `memory`: the emulated device and how a stock SGLang sizes itself on it;
- `pricing`, `clock`: a forward's price and the device clock;
- `sglang_forward`: every SGLang internal the emulation touches, and its hooks;
- `launch`: the SGLang flags and plugin settings of an emulated launch;
- `clock_reader`: a job's emulated seconds, read from ``/server_info``.

Importing this package does not import SGLang.
"""
