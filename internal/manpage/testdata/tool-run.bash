# bash completion for tool-run: generated from tool-run's own definitions by make man; do not edit.

_tool_run() {
	local cur=${COMP_WORDS[COMP_CWORD]} prev=
	((COMP_CWORD > 0)) && prev=${COMP_WORDS[COMP_CWORD - 1]}
	COMPREPLY=()
	local i at=0
	for ((i = 1; i < COMP_CWORD; i++)); do
		case ${COMP_WORDS[i]} in
		--sm|-sm|--socket|-socket) i=$((i + 1)) ;;
		--) at=$((i + 1)); break ;;
		-*) ;;
		*) at=$i; break ;;
		esac
	done
	if ((at > 0 && at < COMP_CWORD)); then
		# The command line: complete it as its own program's.
		if declare -F _command_offset >/dev/null; then
			_command_offset "$at"
		else
			COMPREPLY=($(compgen -f -- "$cur"))
		fi
		return
	fi
	if ((at == COMP_CWORD)); then
		COMPREPLY=($(compgen -c -- "$cur"))
		return
	fi
	case $prev in
	--socket|-socket) COMPREPLY=($(compgen -f -- "$cur")); return ;;
	--sm|-sm) return ;; # a value to type: nothing to offer
	esac
	case $cur in
	-*) COMPREPLY=($(compgen -W '--sm --socket --quiet' -- "$cur")) ;;
	*) COMPREPLY=($(compgen -c -- "$cur")) ;;
	esac
}
complete -F _tool_run tool-run
