#!/usr/bin/env bash
# Spark GPU discovery script: prints the GPUs this executor (or standalone worker) may use as
#   {"name": "gpu", "addresses": ["0", "1"]}
# which is the contract of spark.executor.resource.gpu.discoveryScript and
# spark.worker.resource.gpu.discoveryScript (see conf/spark-gpu.conf).
#
# Addresses are CUDA device ordinals as this process's CUDA runtime numbers them, so a task can
# hand its address straight to CuPy (bigdl_py.spark.gpu does):
#   - without CUDA_VISIBLE_DEVICES: the indices nvidia-smi lists;
#   - with CUDA_VISIBLE_DEVICES: 0..k-1 for its k usable entries. Like CUDA, the list stops at
#     the first entry that names no GPU here (so "0,-1,1" means one GPU), an empty value
#     means none, and GPU-/MIG- UUID entries are taken as valid.
# No nvidia-smi, or an nvidia-smi that fails (no driver): an empty list, so Spark reports
# "no GPUs" instead of a script error. Exit status is 0 in every case.
set -u

indices=""
if command -v nvidia-smi >/dev/null 2>&1; then
    # "|| true": a failing nvidia-smi means no usable GPU, not a failed discovery.
    indices=$(nvidia-smi --query-gpu=index --format=csv,noheader 2>/dev/null | tr -d ' \r' \
        | grep -E '^[0-9]+$' || true)
fi

addresses=()
if [[ -n "$indices" ]]; then
    if [[ -z "${CUDA_VISIBLE_DEVICES+set}" ]]; then
        while read -r index; do
            addresses+=("$index")
        done <<< "$indices"
    else
        ordinal=0
        IFS=',' read -r -a entries <<< "${CUDA_VISIBLE_DEVICES}"
        for entry in "${entries[@]}"; do
            entry="${entry// /}"
            if [[ "$entry" =~ ^[0-9]+$ ]]; then
                grep -qx "$entry" <<< "$indices" || break
            elif [[ ! "$entry" =~ ^(GPU|MIG)- ]]; then
                break
            fi
            addresses+=("$ordinal")
            ordinal=$((ordinal + 1))
        done
    fi
fi

json=""
for address in "${addresses[@]+"${addresses[@]}"}"; do
    json+="${json:+, }\"$address\""
done
printf '{"name": "gpu", "addresses": [%s]}\n' "$json"
