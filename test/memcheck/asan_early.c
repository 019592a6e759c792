/*
 * asan_early.so: preloaded before libasan by scripts/sanitize.sh.
 *
 * PostgreSQL is not built with ASan, so the runtime comes in by LD_PRELOAD
 * and initializes itself lazily, at the first malloc.  In postgres, psql
 * and pg_regress that first malloc happens in another library's
 * constructor that runs earlier (libgpg-error's calls bindtextdomain,
 * p11-kit's newlocale) while glibc holds a locale lock, and the programs
 * then hang on that lock (bindtextdomain in main(), freelocale at exit).
 * An instrumented program would initialize ASan from its .preinit_array,
 * before any constructor; this library does the same from the first of
 * those functions a constructor calls: __asan_init() before glibc takes
 * its lock, then the real function.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <locale.h>

extern void __asan_init(void);

static void *
next(const char *name)
{
	__asan_init();
	return dlsym(RTLD_NEXT, name);
}

char *
bindtextdomain(const char *domain, const char *dir)
{
	static char *(*real) (const char *, const char *);

	if (!real)
		real = next("bindtextdomain");
	return real(domain, dir);
}

char *
bind_textdomain_codeset(const char *domain, const char *codeset)
{
	static char *(*real) (const char *, const char *);

	if (!real)
		real = next("bind_textdomain_codeset");
	return real(domain, codeset);
}

locale_t
newlocale(int mask, const char *locale, locale_t base)
{
	static locale_t (*real) (int, const char *, locale_t);

	if (!real)
		real = next("newlocale");
	return real(mask, locale, base);
}

char *
setlocale(int category, const char *locale)
{
	static char *(*real) (int, const char *);

	if (!real)
		real = next("setlocale");
	return real(category, locale);
}
