#compdef toold
# zsh completion for toold: generated from toold's own definitions by make man; do not edit.

_toold() {
	_arguments \
		'--config=[config]:FILE:_files' \
		'--simulate[simulate]'
}

if [ "$funcstack[1]" = '_toold' ]; then
	_toold "$@"
else
	compdef _toold toold
fi
