from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from typing import ClassVar as _ClassVar, Iterable as _Iterable, Mapping as _Mapping, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class ConfigValue(_message.Message):
    __slots__ = ("int_value", "float_value", "string_value", "bool_value")
    INT_VALUE_FIELD_NUMBER: _ClassVar[int]
    FLOAT_VALUE_FIELD_NUMBER: _ClassVar[int]
    STRING_VALUE_FIELD_NUMBER: _ClassVar[int]
    BOOL_VALUE_FIELD_NUMBER: _ClassVar[int]
    int_value: int
    float_value: float
    string_value: str
    bool_value: bool
    def __init__(self, int_value: _Optional[int] = ..., float_value: _Optional[float] = ..., string_value: _Optional[str] = ..., bool_value: bool = ...) -> None: ...

class ModelSpec(_message.Message):
    __slots__ = ("factory", "config")
    class ConfigEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: ConfigValue
        def __init__(self, key: _Optional[str] = ..., value: _Optional[_Union[ConfigValue, _Mapping]] = ...) -> None: ...
    FACTORY_FIELD_NUMBER: _ClassVar[int]
    CONFIG_FIELD_NUMBER: _ClassVar[int]
    factory: str
    config: _containers.MessageMap[str, ConfigValue]
    def __init__(self, factory: _Optional[str] = ..., config: _Optional[_Mapping[str, ConfigValue]] = ...) -> None: ...

class InnerOptim(_message.Message):
    __slots__ = ("lr", "weight_decay", "beta1", "beta2", "eps", "grad_clip", "warmup_steps", "decay_steps", "min_lr_fraction", "moments")
    LR_FIELD_NUMBER: _ClassVar[int]
    WEIGHT_DECAY_FIELD_NUMBER: _ClassVar[int]
    BETA1_FIELD_NUMBER: _ClassVar[int]
    BETA2_FIELD_NUMBER: _ClassVar[int]
    EPS_FIELD_NUMBER: _ClassVar[int]
    GRAD_CLIP_FIELD_NUMBER: _ClassVar[int]
    WARMUP_STEPS_FIELD_NUMBER: _ClassVar[int]
    DECAY_STEPS_FIELD_NUMBER: _ClassVar[int]
    MIN_LR_FRACTION_FIELD_NUMBER: _ClassVar[int]
    MOMENTS_FIELD_NUMBER: _ClassVar[int]
    lr: float
    weight_decay: float
    beta1: float
    beta2: float
    eps: float
    grad_clip: float
    warmup_steps: int
    decay_steps: int
    min_lr_fraction: float
    moments: str
    def __init__(self, lr: _Optional[float] = ..., weight_decay: _Optional[float] = ..., beta1: _Optional[float] = ..., beta2: _Optional[float] = ..., eps: _Optional[float] = ..., grad_clip: _Optional[float] = ..., warmup_steps: _Optional[int] = ..., decay_steps: _Optional[int] = ..., min_lr_fraction: _Optional[float] = ..., moments: _Optional[str] = ...) -> None: ...

class OuterOptim(_message.Message):
    __slots__ = ("lr", "momentum", "rule", "sparse_mean")
    LR_FIELD_NUMBER: _ClassVar[int]
    MOMENTUM_FIELD_NUMBER: _ClassVar[int]
    RULE_FIELD_NUMBER: _ClassVar[int]
    SPARSE_MEAN_FIELD_NUMBER: _ClassVar[int]
    lr: float
    momentum: float
    rule: str
    sparse_mean: str
    def __init__(self, lr: _Optional[float] = ..., momentum: _Optional[float] = ..., rule: _Optional[str] = ..., sparse_mean: _Optional[str] = ...) -> None: ...

class Phases(_message.Message):
    __slots__ = ("join_blocks", "train_blocks", "reveal_blocks", "verify_blocks", "escalation_blocks", "max_escalations", "result_blocks", "epoch_length", "poc_window", "audit_blocks", "confirm_blocks", "result_rounds", "min_hosts", "min_verifiers", "early_close")
    JOIN_BLOCKS_FIELD_NUMBER: _ClassVar[int]
    TRAIN_BLOCKS_FIELD_NUMBER: _ClassVar[int]
    REVEAL_BLOCKS_FIELD_NUMBER: _ClassVar[int]
    VERIFY_BLOCKS_FIELD_NUMBER: _ClassVar[int]
    ESCALATION_BLOCKS_FIELD_NUMBER: _ClassVar[int]
    MAX_ESCALATIONS_FIELD_NUMBER: _ClassVar[int]
    RESULT_BLOCKS_FIELD_NUMBER: _ClassVar[int]
    EPOCH_LENGTH_FIELD_NUMBER: _ClassVar[int]
    POC_WINDOW_FIELD_NUMBER: _ClassVar[int]
    AUDIT_BLOCKS_FIELD_NUMBER: _ClassVar[int]
    CONFIRM_BLOCKS_FIELD_NUMBER: _ClassVar[int]
    RESULT_ROUNDS_FIELD_NUMBER: _ClassVar[int]
    MIN_HOSTS_FIELD_NUMBER: _ClassVar[int]
    MIN_VERIFIERS_FIELD_NUMBER: _ClassVar[int]
    EARLY_CLOSE_FIELD_NUMBER: _ClassVar[int]
    join_blocks: int
    train_blocks: int
    reveal_blocks: int
    verify_blocks: int
    escalation_blocks: int
    max_escalations: int
    result_blocks: int
    epoch_length: int
    poc_window: int
    audit_blocks: int
    confirm_blocks: int
    result_rounds: int
    min_hosts: int
    min_verifiers: int
    early_close: bool
    def __init__(self, join_blocks: _Optional[int] = ..., train_blocks: _Optional[int] = ..., reveal_blocks: _Optional[int] = ..., verify_blocks: _Optional[int] = ..., escalation_blocks: _Optional[int] = ..., max_escalations: _Optional[int] = ..., result_blocks: _Optional[int] = ..., epoch_length: _Optional[int] = ..., poc_window: _Optional[int] = ..., audit_blocks: _Optional[int] = ..., confirm_blocks: _Optional[int] = ..., result_rounds: _Optional[int] = ..., min_hosts: _Optional[int] = ..., min_verifiers: _Optional[int] = ..., early_close: bool = ...) -> None: ...

class Stake(_message.Message):
    __slots__ = ("min_host_stake", "min_verifier_stake", "host_slash_bps", "verifier_slash_bps", "reward_per_outer_step", "fraud_host_slash_bps", "fraud_verifier_slash_bps")
    MIN_HOST_STAKE_FIELD_NUMBER: _ClassVar[int]
    MIN_VERIFIER_STAKE_FIELD_NUMBER: _ClassVar[int]
    HOST_SLASH_BPS_FIELD_NUMBER: _ClassVar[int]
    VERIFIER_SLASH_BPS_FIELD_NUMBER: _ClassVar[int]
    REWARD_PER_OUTER_STEP_FIELD_NUMBER: _ClassVar[int]
    FRAUD_HOST_SLASH_BPS_FIELD_NUMBER: _ClassVar[int]
    FRAUD_VERIFIER_SLASH_BPS_FIELD_NUMBER: _ClassVar[int]
    min_host_stake: int
    min_verifier_stake: int
    host_slash_bps: int
    verifier_slash_bps: int
    reward_per_outer_step: int
    fraud_host_slash_bps: int
    fraud_verifier_slash_bps: int
    def __init__(self, min_host_stake: _Optional[int] = ..., min_verifier_stake: _Optional[int] = ..., host_slash_bps: _Optional[int] = ..., verifier_slash_bps: _Optional[int] = ..., reward_per_outer_step: _Optional[int] = ..., fraud_host_slash_bps: _Optional[int] = ..., fraud_verifier_slash_bps: _Optional[int] = ...) -> None: ...

class RunConfig(_message.Message):
    __slots__ = ("name", "model", "dataset_manifest_hash", "initial_model_hash", "seed", "inner_steps", "segment_len", "sampled_segments", "verifiers_per_contribution", "batch_size", "seq_len", "data_shards", "codec", "codec_block_size", "inner", "outer", "phases", "stake", "replay_mode", "tolerance", "threads", "max_outer_steps", "state_chunk_bytes", "audit_bps", "audit_verifiers", "tolerance_exp_avg", "tolerance_exp_avg_sq", "numerics", "overlap", "tolerance_update", "tolerance_denominator", "codec_topk", "codec_ef_decay", "tolerance_cumulative", "tolerance_cumulative_update", "sampling", "window_segments")
    NAME_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    DATASET_MANIFEST_HASH_FIELD_NUMBER: _ClassVar[int]
    INITIAL_MODEL_HASH_FIELD_NUMBER: _ClassVar[int]
    SEED_FIELD_NUMBER: _ClassVar[int]
    INNER_STEPS_FIELD_NUMBER: _ClassVar[int]
    SEGMENT_LEN_FIELD_NUMBER: _ClassVar[int]
    SAMPLED_SEGMENTS_FIELD_NUMBER: _ClassVar[int]
    VERIFIERS_PER_CONTRIBUTION_FIELD_NUMBER: _ClassVar[int]
    BATCH_SIZE_FIELD_NUMBER: _ClassVar[int]
    SEQ_LEN_FIELD_NUMBER: _ClassVar[int]
    DATA_SHARDS_FIELD_NUMBER: _ClassVar[int]
    CODEC_FIELD_NUMBER: _ClassVar[int]
    CODEC_BLOCK_SIZE_FIELD_NUMBER: _ClassVar[int]
    INNER_FIELD_NUMBER: _ClassVar[int]
    OUTER_FIELD_NUMBER: _ClassVar[int]
    PHASES_FIELD_NUMBER: _ClassVar[int]
    STAKE_FIELD_NUMBER: _ClassVar[int]
    REPLAY_MODE_FIELD_NUMBER: _ClassVar[int]
    TOLERANCE_FIELD_NUMBER: _ClassVar[int]
    THREADS_FIELD_NUMBER: _ClassVar[int]
    MAX_OUTER_STEPS_FIELD_NUMBER: _ClassVar[int]
    STATE_CHUNK_BYTES_FIELD_NUMBER: _ClassVar[int]
    AUDIT_BPS_FIELD_NUMBER: _ClassVar[int]
    AUDIT_VERIFIERS_FIELD_NUMBER: _ClassVar[int]
    TOLERANCE_EXP_AVG_FIELD_NUMBER: _ClassVar[int]
    TOLERANCE_EXP_AVG_SQ_FIELD_NUMBER: _ClassVar[int]
    NUMERICS_FIELD_NUMBER: _ClassVar[int]
    OVERLAP_FIELD_NUMBER: _ClassVar[int]
    TOLERANCE_UPDATE_FIELD_NUMBER: _ClassVar[int]
    TOLERANCE_DENOMINATOR_FIELD_NUMBER: _ClassVar[int]
    CODEC_TOPK_FIELD_NUMBER: _ClassVar[int]
    CODEC_EF_DECAY_FIELD_NUMBER: _ClassVar[int]
    TOLERANCE_CUMULATIVE_FIELD_NUMBER: _ClassVar[int]
    TOLERANCE_CUMULATIVE_UPDATE_FIELD_NUMBER: _ClassVar[int]
    SAMPLING_FIELD_NUMBER: _ClassVar[int]
    WINDOW_SEGMENTS_FIELD_NUMBER: _ClassVar[int]
    name: str
    model: ModelSpec
    dataset_manifest_hash: str
    initial_model_hash: str
    seed: int
    inner_steps: int
    segment_len: int
    sampled_segments: int
    verifiers_per_contribution: int
    batch_size: int
    seq_len: int
    data_shards: int
    codec: str
    codec_block_size: int
    inner: InnerOptim
    outer: OuterOptim
    phases: Phases
    stake: Stake
    replay_mode: str
    tolerance: float
    threads: int
    max_outer_steps: int
    state_chunk_bytes: int
    audit_bps: int
    audit_verifiers: int
    tolerance_exp_avg: float
    tolerance_exp_avg_sq: float
    numerics: Numerics
    overlap: str
    tolerance_update: float
    tolerance_denominator: float
    codec_topk: int
    codec_ef_decay: float
    tolerance_cumulative: float
    tolerance_cumulative_update: float
    sampling: str
    window_segments: int
    def __init__(self, name: _Optional[str] = ..., model: _Optional[_Union[ModelSpec, _Mapping]] = ..., dataset_manifest_hash: _Optional[str] = ..., initial_model_hash: _Optional[str] = ..., seed: _Optional[int] = ..., inner_steps: _Optional[int] = ..., segment_len: _Optional[int] = ..., sampled_segments: _Optional[int] = ..., verifiers_per_contribution: _Optional[int] = ..., batch_size: _Optional[int] = ..., seq_len: _Optional[int] = ..., data_shards: _Optional[int] = ..., codec: _Optional[str] = ..., codec_block_size: _Optional[int] = ..., inner: _Optional[_Union[InnerOptim, _Mapping]] = ..., outer: _Optional[_Union[OuterOptim, _Mapping]] = ..., phases: _Optional[_Union[Phases, _Mapping]] = ..., stake: _Optional[_Union[Stake, _Mapping]] = ..., replay_mode: _Optional[str] = ..., tolerance: _Optional[float] = ..., threads: _Optional[int] = ..., max_outer_steps: _Optional[int] = ..., state_chunk_bytes: _Optional[int] = ..., audit_bps: _Optional[int] = ..., audit_verifiers: _Optional[int] = ..., tolerance_exp_avg: _Optional[float] = ..., tolerance_exp_avg_sq: _Optional[float] = ..., numerics: _Optional[_Union[Numerics, _Mapping]] = ..., overlap: _Optional[str] = ..., tolerance_update: _Optional[float] = ..., tolerance_denominator: _Optional[float] = ..., codec_topk: _Optional[int] = ..., codec_ef_decay: _Optional[float] = ..., tolerance_cumulative: _Optional[float] = ..., tolerance_cumulative_update: _Optional[float] = ..., sampling: _Optional[str] = ..., window_segments: _Optional[int] = ...) -> None: ...

class Numerics(_message.Message):
    __slots__ = ("precision", "tf32", "attention")
    PRECISION_FIELD_NUMBER: _ClassVar[int]
    TF32_FIELD_NUMBER: _ClassVar[int]
    ATTENTION_FIELD_NUMBER: _ClassVar[int]
    precision: str
    tf32: bool
    attention: str
    def __init__(self, precision: _Optional[str] = ..., tf32: bool = ..., attention: _Optional[str] = ...) -> None: ...

class EnvFingerprint(_message.Message):
    __slots__ = ("torch_version", "threads", "deterministic", "device", "micro_batches", "torch_git", "cpu_capability", "gpu_name", "compute_capability", "sm_count", "cuda_version", "cudnn_version", "nccl_version", "replay_class")
    TORCH_VERSION_FIELD_NUMBER: _ClassVar[int]
    THREADS_FIELD_NUMBER: _ClassVar[int]
    DETERMINISTIC_FIELD_NUMBER: _ClassVar[int]
    DEVICE_FIELD_NUMBER: _ClassVar[int]
    MICRO_BATCHES_FIELD_NUMBER: _ClassVar[int]
    TORCH_GIT_FIELD_NUMBER: _ClassVar[int]
    CPU_CAPABILITY_FIELD_NUMBER: _ClassVar[int]
    GPU_NAME_FIELD_NUMBER: _ClassVar[int]
    COMPUTE_CAPABILITY_FIELD_NUMBER: _ClassVar[int]
    SM_COUNT_FIELD_NUMBER: _ClassVar[int]
    CUDA_VERSION_FIELD_NUMBER: _ClassVar[int]
    CUDNN_VERSION_FIELD_NUMBER: _ClassVar[int]
    NCCL_VERSION_FIELD_NUMBER: _ClassVar[int]
    REPLAY_CLASS_FIELD_NUMBER: _ClassVar[int]
    torch_version: str
    threads: int
    deterministic: bool
    device: str
    micro_batches: int
    torch_git: str
    cpu_capability: str
    gpu_name: str
    compute_capability: str
    sm_count: int
    cuda_version: str
    cudnn_version: str
    nccl_version: str
    replay_class: str
    def __init__(self, torch_version: _Optional[str] = ..., threads: _Optional[int] = ..., deterministic: bool = ..., device: _Optional[str] = ..., micro_batches: _Optional[int] = ..., torch_git: _Optional[str] = ..., cpu_capability: _Optional[str] = ..., gpu_name: _Optional[str] = ..., compute_capability: _Optional[str] = ..., sm_count: _Optional[int] = ..., cuda_version: _Optional[str] = ..., cudnn_version: _Optional[str] = ..., nccl_version: _Optional[str] = ..., replay_class: _Optional[str] = ...) -> None: ...

class MsgCreateRun(_message.Message):
    __slots__ = ("creator", "config")
    CREATOR_FIELD_NUMBER: _ClassVar[int]
    CONFIG_FIELD_NUMBER: _ClassVar[int]
    creator: str
    config: RunConfig
    def __init__(self, creator: _Optional[str] = ..., config: _Optional[_Union[RunConfig, _Mapping]] = ...) -> None: ...

class MsgJoinRun(_message.Message):
    __slots__ = ("creator", "run_id", "role", "endpoint", "stake", "replay_class")
    CREATOR_FIELD_NUMBER: _ClassVar[int]
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    ROLE_FIELD_NUMBER: _ClassVar[int]
    ENDPOINT_FIELD_NUMBER: _ClassVar[int]
    STAKE_FIELD_NUMBER: _ClassVar[int]
    REPLAY_CLASS_FIELD_NUMBER: _ClassVar[int]
    creator: str
    run_id: int
    role: str
    endpoint: str
    stake: int
    replay_class: str
    def __init__(self, creator: _Optional[str] = ..., run_id: _Optional[int] = ..., role: _Optional[str] = ..., endpoint: _Optional[str] = ..., stake: _Optional[int] = ..., replay_class: _Optional[str] = ...) -> None: ...

class MsgLeaveRun(_message.Message):
    __slots__ = ("creator", "run_id")
    CREATOR_FIELD_NUMBER: _ClassVar[int]
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    creator: str
    run_id: int
    def __init__(self, creator: _Optional[str] = ..., run_id: _Optional[int] = ...) -> None: ...

class MsgCommitPseudoGradient(_message.Message):
    __slots__ = ("creator", "run_id", "outer_step", "base_model_hash", "trajectory_root", "leaf_count", "delta_hash", "final_optimizer_hash", "codec", "tokens", "env", "final_ef_hash")
    CREATOR_FIELD_NUMBER: _ClassVar[int]
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    OUTER_STEP_FIELD_NUMBER: _ClassVar[int]
    BASE_MODEL_HASH_FIELD_NUMBER: _ClassVar[int]
    TRAJECTORY_ROOT_FIELD_NUMBER: _ClassVar[int]
    LEAF_COUNT_FIELD_NUMBER: _ClassVar[int]
    DELTA_HASH_FIELD_NUMBER: _ClassVar[int]
    FINAL_OPTIMIZER_HASH_FIELD_NUMBER: _ClassVar[int]
    CODEC_FIELD_NUMBER: _ClassVar[int]
    TOKENS_FIELD_NUMBER: _ClassVar[int]
    ENV_FIELD_NUMBER: _ClassVar[int]
    FINAL_EF_HASH_FIELD_NUMBER: _ClassVar[int]
    creator: str
    run_id: int
    outer_step: int
    base_model_hash: str
    trajectory_root: str
    leaf_count: int
    delta_hash: str
    final_optimizer_hash: str
    codec: str
    tokens: int
    env: EnvFingerprint
    final_ef_hash: str
    def __init__(self, creator: _Optional[str] = ..., run_id: _Optional[int] = ..., outer_step: _Optional[int] = ..., base_model_hash: _Optional[str] = ..., trajectory_root: _Optional[str] = ..., leaf_count: _Optional[int] = ..., delta_hash: _Optional[str] = ..., final_optimizer_hash: _Optional[str] = ..., codec: _Optional[str] = ..., tokens: _Optional[int] = ..., env: _Optional[_Union[EnvFingerprint, _Mapping]] = ..., final_ef_hash: _Optional[str] = ...) -> None: ...

class SegmentOpening(_message.Message):
    __slots__ = ("segment", "start_leaf", "end_leaf", "proof")
    SEGMENT_FIELD_NUMBER: _ClassVar[int]
    START_LEAF_FIELD_NUMBER: _ClassVar[int]
    END_LEAF_FIELD_NUMBER: _ClassVar[int]
    PROOF_FIELD_NUMBER: _ClassVar[int]
    segment: int
    start_leaf: str
    end_leaf: str
    proof: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, segment: _Optional[int] = ..., start_leaf: _Optional[str] = ..., end_leaf: _Optional[str] = ..., proof: _Optional[_Iterable[str]] = ...) -> None: ...

class MsgRevealContribution(_message.Message):
    __slots__ = ("creator", "run_id", "outer_step", "openings")
    CREATOR_FIELD_NUMBER: _ClassVar[int]
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    OUTER_STEP_FIELD_NUMBER: _ClassVar[int]
    OPENINGS_FIELD_NUMBER: _ClassVar[int]
    creator: str
    run_id: int
    outer_step: int
    openings: _containers.RepeatedCompositeFieldContainer[SegmentOpening]
    def __init__(self, creator: _Optional[str] = ..., run_id: _Optional[int] = ..., outer_step: _Optional[int] = ..., openings: _Optional[_Iterable[_Union[SegmentOpening, _Mapping]]] = ...) -> None: ...

class MsgSubmitVerdict(_message.Message):
    __slots__ = ("creator", "run_id", "outer_step", "host", "reason", "evidence_hash", "detail")
    CREATOR_FIELD_NUMBER: _ClassVar[int]
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    OUTER_STEP_FIELD_NUMBER: _ClassVar[int]
    HOST_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    EVIDENCE_HASH_FIELD_NUMBER: _ClassVar[int]
    DETAIL_FIELD_NUMBER: _ClassVar[int]
    creator: str
    run_id: int
    outer_step: int
    host: str
    reason: int
    evidence_hash: str
    detail: str
    def __init__(self, creator: _Optional[str] = ..., run_id: _Optional[int] = ..., outer_step: _Optional[int] = ..., host: _Optional[str] = ..., reason: _Optional[int] = ..., evidence_hash: _Optional[str] = ..., detail: _Optional[str] = ...) -> None: ...

class MsgSubmitOuterResult(_message.Message):
    __slots__ = ("creator", "run_id", "outer_step", "model_hash", "val_loss_ppm")
    CREATOR_FIELD_NUMBER: _ClassVar[int]
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    OUTER_STEP_FIELD_NUMBER: _ClassVar[int]
    MODEL_HASH_FIELD_NUMBER: _ClassVar[int]
    VAL_LOSS_PPM_FIELD_NUMBER: _ClassVar[int]
    creator: str
    run_id: int
    outer_step: int
    model_hash: str
    val_loss_ppm: int
    def __init__(self, creator: _Optional[str] = ..., run_id: _Optional[int] = ..., outer_step: _Optional[int] = ..., model_hash: _Optional[str] = ..., val_loss_ppm: _Optional[int] = ...) -> None: ...

class MsgReportUnavailable(_message.Message):
    __slots__ = ("creator", "run_id", "outer_step", "hosts")
    CREATOR_FIELD_NUMBER: _ClassVar[int]
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    OUTER_STEP_FIELD_NUMBER: _ClassVar[int]
    HOSTS_FIELD_NUMBER: _ClassVar[int]
    creator: str
    run_id: int
    outer_step: int
    hosts: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, creator: _Optional[str] = ..., run_id: _Optional[int] = ..., outer_step: _Optional[int] = ..., hosts: _Optional[_Iterable[str]] = ...) -> None: ...

class MsgCreateRunResponse(_message.Message):
    __slots__ = ("run_id",)
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    run_id: int
    def __init__(self, run_id: _Optional[int] = ...) -> None: ...

class MsgJoinRunResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class MsgLeaveRunResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class MsgCommitPseudoGradientResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class MsgRevealContributionResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class MsgSubmitVerdictResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class MsgSubmitOuterResultResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class MsgReportUnavailableResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...
