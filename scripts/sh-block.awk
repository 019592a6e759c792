# The first ```sh block after the Markdown heading that matches `heading`
# (a regular expression), as written:
#
#   awk -v heading='^## Install$' -f scripts/sh-block.awk docs/clients.md
#
# Used by the checks that run documented commands as a user would type them
# (scripts/fresh-machine.sh, test/clients/run.sh).
$0 ~ heading { s = 1 }
s && /^```sh/ { b = 1; next }
b && /^```/ { exit }
b
