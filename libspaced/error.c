/* error.c — strings for the spaced error space. */
#include "spaced_error.h"

const char *spaced_strerror(int err)
{
	switch (err) {
#define SPACED_ERR_STR(name, val, str) case (val): return (str);
	SPACED_ERRORS(SPACED_ERR_STR)
#undef SPACED_ERR_STR
	}
	return "unknown error";
}

const char *spaced_errname(int err)
{
	switch (err) {
#define SPACED_ERR_NAME(name, val, str) case (val): return #name;
	SPACED_ERRORS(SPACED_ERR_NAME)
#undef SPACED_ERR_NAME
	}
	return "SPACED_E?";
}
