/*
 * cmd_completion.c — `spacectl completion bash`: a bash completion script.
 * It learns the commands and their options from `spacectl help` each time
 * it completes, so it never goes stale as commands are added; sandbox IDs
 * come from `spacectl ls` when a control plane is configured.
 */
#include <stdio.h>
#include <string.h>

#include "cli.h"
#include "cmd_ops.h"

static const char bash_script[] =
	"# bash completion for spacectl (spacectl completion bash)\n"
	"_spacectl_help() { command spacectl help 2>&1; }\n"
	"_spacectl() {\n"
	"\tlocal cur=${COMP_WORDS[COMP_CWORD]} help cmds i first='' second=''\n"
	"\tCOMPREPLY=()\n"
	"\thelp=$(_spacectl_help)\n"
	"\tfor ((i = 1; i < COMP_CWORD; i++)); do\n"
	"\t\tcase ${COMP_WORDS[i]} in -v) ;; *) if [ -z \"$first\" ]; then first=${COMP_WORDS[i]};\n"
	"\t\t\telif [ -z \"$second\" ]; then second=${COMP_WORDS[i]}; fi ;; esac\n"
	"\tdone\n"
	"\tif [ -z \"$first\" ]; then\n"
	"\t\t# the first word of each usage line, and of each ' | '-separated alternative\n"
	"\t\tcmds=$(printf '%s\\n' \"$help\" | sed -n 's/^  \\(\\[-v\\] \\)\\{0,1\\}\\([a-z][a-z-]*\\).*/\\2/p'\n"
	"\t\t\tprintf '%s\\n' \"$help\" | grep -o '| [a-z][a-z-]*' | cut -c3-)\n"
	"\t\tCOMPREPLY=($(compgen -W \"$(printf '%s\\n' $cmds help | sort -u)\" -- \"$cur\"))\n"
	"\t\treturn\n"
	"\tfi\n"
	"\tlocal lines\n"
	"\tlines=$(printf '%s\\n' \"$help\" | grep -E \"(^  (\\[-v\\] )?|\\| )$first( |$)\")\n"
	"\tif [ -z \"$second\" ]; then\n"
	"\t\t# subcommands: 'fs read|write|…' or 'dev up … | dev down' or one line each ('token sign')\n"
	"\t\tlocal subs\n"
	"\t\tsubs=$( { printf '%s\\n' \"$lines\" | grep -oE \"$first [a-z]+(\\|[a-z]+)+\" | cut -d' ' -f2 | tr '|' '\\n'\n"
	"\t\t\tprintf '%s\\n' \"$lines\" | grep -oE \"(^  |\\| )$first [a-z]+\" | awk '{print $NF}'; } | sort -u)\n"
	"\t\tif [ -n \"$subs\" ]; then\n"
	"\t\t\tCOMPREPLY=($(compgen -W \"$subs\" -- \"$cur\"))\n"
	"\t\t\treturn\n"
	"\t\tfi\n"
	"\tfi\n"
	"\tif [[ $cur == -* ]]; then\n"
	"\t\tCOMPREPLY=($(compgen -W \"$(printf '%s\\n' \"$lines\" | grep -oE -- '--[a-z-]+' | sort -u) --route --no-retry\" -- \"$cur\"))\n"
	"\t\treturn\n"
	"\tfi\n"
	"\tif printf '%s\\n' \"$lines\" | grep -q ' ID'; then\n"
	"\t\tCOMPREPLY=($(compgen -W \"$(command spacectl ls 2>/dev/null | awk 'NR > 1 || $1 ~ /^sbx-/ {print $1}')\" -- \"$cur\"))\n"
	"\tfi\n"
	"}\n"
	"complete -o default -F _spacectl spacectl\n";

int cmd_completion(int argc, char **argv)
{
	if (argc != 2 || strcmp(argv[1], "bash") != 0)
		return cli_usage("usage: spacectl completion bash    (then: source <(spacectl completion bash))\n");
	fputs(bash_script, stdout);
	return 0;
}
