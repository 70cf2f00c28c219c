#compdef tool-run
# zsh completion for tool-run: generated from tool-run's own definitions by make man; do not edit.

_tool_run() {
	_arguments -S -A '-*' \
		'--sm=[percent]:PCT: ' \
		'--socket=[socket]:PATH:_files' \
		'--quiet[quiet]' \
		'1:command:_command_names -e' \
		'*::arguments:_normal'
}

if [ "$funcstack[1]" = '_tool_run' ]; then
	_tool_run "$@"
else
	compdef _tool_run tool-run
fi
