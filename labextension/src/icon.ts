/** The slice panel's side bar icon: a chip with pins, drawn in the theme's icon colour. */

import { LabIcon } from '@jupyterlab/ui-components';

const svgstr = `<svg xmlns="http://www.w3.org/2000/svg" width="16" viewBox="0 0 24 24">
  <g class="jp-icon3" fill="#616161">
    <path d="M7 7h10v10H7zm2 2v6h6V9z"/>
    <path d="M9 3h2v3H9zm4 0h2v3h-2zM9 18h2v3H9zm4 0h2v3h-2zM3 9h3v2H3zm0 4h3v2H3zm15-4h3v2h-3zm0 4h3v2h-3z"/>
  </g>
</svg>`;

export const gpuIcon = new LabIcon({ name: 'hami-jupyter:gpu', svgstr });
