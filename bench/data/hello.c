/* Input for the clang entry of bench/suite.toml: a small program that
 * pulls in the usual headers, so the compiler's own start-up dominates. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <math.h>

static double mean(const double *v, size_t n)
{
	double s = 0;
	for (size_t i = 0; i < n; i++)
		s += v[i];
	return n ? s / n : NAN;
}

int main(int argc, char **argv)
{
	double v[64];
	for (int i = 0; i < 64; i++)
		v[i] = sqrt((double)i + argc);
	printf("%s %.3f\n", argc > 1 ? argv[1] : "", mean(v, 64));
	return strlen(argv[0]) > 1000 ? EXIT_FAILURE : EXIT_SUCCESS;
}
