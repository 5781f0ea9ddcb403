#!/bin/bash
# Entrypoint of the trex Ascend image: source CANN's environment scripts (toolkit, AscendNPU IR, NNAL/ATB),
# as the CANN base image's own entrypoint does, then run the given command (trex pods pass it as args).
# TREX_ASCEND_HOME: where CANN is installed (default /usr/local/Ascend).
root="${TREX_ASCEND_HOME:-/usr/local/Ascend}"
command=("$@")
set --  # the scripts parse their own arguments: give them none of the command's
for env_file in "$root"/ascend-toolkit/set_env.sh \
                "$root"/cann-*/share/info/ascendnpu-ir/bin/set_env.sh \
                "$root"/nnal/atb/set_env.sh; do
  if [ -f "$env_file" ]; then
    # shellcheck disable=SC1090
    source "$env_file"
  fi
done
if [ "${#command[@]}" -eq 0 ]; then
  command=(trex --help)
fi
exec "${command[@]}"
