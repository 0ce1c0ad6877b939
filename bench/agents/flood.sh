#!/bin/sh
# Memory benchmark agent: write $2 bytes to stdout, shaped by $1:
#   body      ~1 KiB reply-body lines
#   partials  ~1 KiB AGENT_PARTIAL lines
#   oneline   a single line with no newline at all (exercises the 1 MiB line cut)
mode=$1
bytes=$2
line=$(printf '%01000d' 0 | tr 0 b)
case $mode in
  body)     yes "$line" | head -c "$bytes" ;;
  partials) yes "AGENT_PARTIAL: $line" | head -c "$bytes" ;;
  oneline)  head -c "$bytes" /dev/zero | tr '\0' x ;;
  *)        echo "AGENT_ERROR: unknown mode $mode"; exit 2 ;;
esac
