#compdef tool-ctl
# zsh completion for tool-ctl: generated from tool-ctl's own definitions by make man; do not edit.

_tool_ctl() {
	local curcontext=$curcontext state line
	typeset -A opt_args
	local -a commands
	commands=(
		'status:show: it'\''s all'
		'drain:close'
		'check:check a file'
		'shutdown:stop'
		'help:help'
	)
	_arguments -C \
		'--socket=[the socket \[default /run/x\]]:PATH:_files' \
		'--version[print the version]' \
		'1: :->command' \
		'*:: :->args'
	case $state in
	command) _describe -t commands 'tool-ctl command' commands ;;
	args)
		curcontext=${curcontext%:*:*}:tool-ctl-$words[1]:
		case $words[1] in
		status)
			_arguments \
				'-o+[output FORMAT]:FORMAT: ' \
				'--json[as JSON]' \
				'--group=[a group]:G: '
			;;
		drain)
			_arguments \
				'--gpu=[a GPU]:SEL: '
			;;
		check)
			_arguments \
				'--dir=[a directory]:DIR:_files -/' \
				'*:file:_files'
			;;
		shutdown)
			_message 'no arguments'
			;;
		help)
			_arguments \
				'1:command:(status drain check shutdown help)'
			;;
		esac
		;;
	esac
}

if [ "$funcstack[1]" = '_tool_ctl' ]; then
	_tool_ctl "$@"
else
	compdef _tool_ctl tool-ctl
fi
