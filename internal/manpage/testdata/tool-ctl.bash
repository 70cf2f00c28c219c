# bash completion for tool-ctl: generated from tool-ctl's own definitions by make man; do not edit.

_tool_ctl() {
	local cur=${COMP_WORDS[COMP_CWORD]} prev=
	((COMP_CWORD > 0)) && prev=${COMP_WORDS[COMP_CWORD - 1]}
	COMPREPLY=()
	local i at=0
	for ((i = 1; i < COMP_CWORD; i++)); do
		case ${COMP_WORDS[i]} in
		--socket|-socket) i=$((i + 1)) ;;
		-*) ;;
		*) at=$i; break ;;
		esac
	done
	if ((at == 0)); then
		case $prev in
		--socket|-socket) COMPREPLY=($(compgen -f -- "$cur")); return ;;
		esac
		case $cur in
		-*) COMPREPLY=($(compgen -W '--socket --version' -- "$cur")) ;;
		*) COMPREPLY=($(compgen -W 'status drain check shutdown help' -- "$cur")) ;;
		esac
		return
	fi
	case ${COMP_WORDS[at]} in
	status)
		case $prev in
		-o|--o|--group|-group) return ;; # a value to type: nothing to offer
		esac
		case $cur in
		-*) COMPREPLY=($(compgen -W '-o --json --group' -- "$cur")) ;;
		esac
		;;
	drain)
		case $prev in
		--gpu|-gpu) return ;; # a value to type: nothing to offer
		esac
		case $cur in
		-*) COMPREPLY=($(compgen -W '--gpu' -- "$cur")) ;;
		esac
		;;
	check)
		case $prev in
		--dir|-dir) COMPREPLY=($(compgen -d -- "$cur")); return ;;
		esac
		case $cur in
		-*) COMPREPLY=($(compgen -W '--dir' -- "$cur")) ;;
		*) COMPREPLY=($(compgen -f -- "$cur")) ;;
		esac
		;;
	shutdown)
		;;
	help)
		case $cur in
		*) COMPREPLY=($(compgen -W 'status drain check shutdown help' -- "$cur")) ;;
		esac
		;;
	esac
}
complete -F _tool_ctl tool-ctl
