/*
 * tmpl_build.c — spacectl template build (docs/templates.md, "Spacefiles").
 */
#include "cli.h"
#include "tmpl.h"

int tmpl_build(int argc, char **argv)
{
	(void)argc;
	(void)argv;
	return cli_fail("template build", "not built yet");
}
