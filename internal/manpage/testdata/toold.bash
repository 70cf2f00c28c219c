# bash completion for toold: generated from toold's own definitions by make man; do not edit.

_toold() {
	local cur=${COMP_WORDS[COMP_CWORD]} prev=
	((COMP_CWORD > 0)) && prev=${COMP_WORDS[COMP_CWORD - 1]}
	COMPREPLY=()
	case $prev in
	--config|-config) COMPREPLY=($(compgen -f -- "$cur")); return ;;
	esac
	COMPREPLY=($(compgen -W '--config --simulate' -- "$cur"))
}
complete -F _toold toold
